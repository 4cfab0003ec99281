package cli

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/d1idem/d1idem/idem"
)

// keysScope is what a keys command works on: the administrative API, and
// for people, where it reads.
type keysScope struct {
	a     *idem.Admin
	where string
	// On a ledger across several databases: the sharded ledger, its
	// databases, and the administrative API of one of them.
	ledger  *idem.Ledger
	set     *dbSet
	adminOf func(cn *conn) (*idem.Admin, error)
}

// shardedKeys is the keys commands' scope over several databases: a
// sharded ledger, which routes each principal by the ring recorded in them
// and merges their lists.
func shardedKeys(o *options, s *dbSet, ttl time.Duration) (*keysScope, error) {
	l, err := shardedLedger(o, s, keysConfig(ttl))
	if err != nil {
		return nil, err
	}
	adminOf := func(cn *conn) (*idem.Admin, error) { return keysAdmin(o, cn, ttl) }
	return &keysScope{a: l.Admin(), where: s.where(), ledger: l, set: s, adminOf: adminOf}, nil
}

// home names the database that holds a principal's key on a ledger across
// several databases; "" on one database. While the ring is moving, a moved
// principal's key may be at its old home, which is read first, as
// Admin.Get reads it. label names the database; text says more, for
// people.
func (ks *keysScope) home(ctx context.Context, principal, key string) (label, text string, err error) {
	if ks.ledger == nil {
		return "", "", nil
	}
	r, err := ks.ledger.Ring(ctx)
	if err != nil {
		return "", "", err
	}
	now, old := r.Home(principal), r.PreviousHome(principal)
	if old == "" {
		return ks.set.label(now), ks.set.label(now), nil
	}
	cn := ks.set.byID(old)
	if cn == nil {
		return "", "", fmt.Errorf("%w: %q", idem.ErrUnknownHome, old)
	}
	a, err := ks.adminOf(cn)
	if err != nil {
		return "", "", err
	}
	switch _, err := a.Get(ctx, principal, key); {
	case err == nil:
		return ks.set.label(old), fmt.Sprintf("%s (the principal's home before version %d; its new keys go to %s)", ks.set.label(old), r.Version, ks.set.label(now)), nil
	case errors.Is(err, idem.ErrKeyNotFound):
		return ks.set.label(now), fmt.Sprintf("%s (the principal's home since version %d, moved from %s)", ks.set.label(now), r.Version, ks.set.label(old)), nil
	}
	return "", "", err
}

// byID is the set's database with this ID; nil when there is none.
func (s *dbSet) byID(id string) *conn {
	for _, cn := range s.conns {
		if cn.databaseID == id {
			return cn
		}
	}
	return nil
}
