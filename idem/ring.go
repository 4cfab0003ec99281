package idem

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"
)

// The reserved rows (under the empty principal, which no request can address) and their formats.
const (
	ringKey    = "d1idem:ring"
	homeKey    = "d1idem:home"
	ringFormat = "d1idem-ring/1"
	homeFormat = "d1idem-home/1"
	maxHomeID  = 255 // the longest Home.ID accepted
)

// RingPhase is the phase of a ring.
type RingPhase string

// The phases of a ring (see Admin.Grow and Admin.AdvanceRing).
const (
	RingStable RingPhase = "stable" // every principal's keys are at Ring.Home(principal)
	RingMoving RingPhase = "moving" // a moved principal's existing keys stay at its old home, read first
)

// Ring is the versioned set of databases a sharded ledger spans, recorded in each; see Rendezvous.
type Ring struct {
	Version  int64 // the first ring is version 1
	Phase    RingPhase
	Homes    []string // this version's database IDs, sorted
	Previous []string // while Moving, the previous version's homes (a subset); nil when Stable
}

// Epoch orders rings (the ring row's generation): 2v-1 while Moving, 2v when Stable.
func (r Ring) Epoch() int64 {
	if r.Phase == RingMoving {
		return 2*r.Version - 1
	}
	return 2 * r.Version
}

// Home returns the ID of the database that holds principal's new keys.
func (r Ring) Home(principal string) string { return Rendezvous(principal, r.Homes) }

// PreviousHome returns a moved principal's old home while the ring is Moving, else "".
func (r Ring) PreviousHome(principal string) string {
	if r.Phase != RingMoving {
		return ""
	}
	if old := Rendezvous(principal, r.Previous); old != r.Home(principal) {
		return old
	}
	return ""
}

// String describes the ring, such as "v2 moving [a b c] from [a b]".
func (r Ring) String() string {
	s := fmt.Sprintf("v%d %s %v", r.Version, r.Phase, r.Homes)
	if r.Phase == RingMoving {
		s += fmt.Sprintf(" from %v", r.Previous)
	}
	return s
}

func (r Ring) equal(o Ring) bool {
	return r.Version == o.Version && r.Phase == o.Phase && slices.Equal(r.Homes, o.Homes) && slices.Equal(r.Previous, o.Previous)
}

// digest, the hex SHA-256 of the ring's encoding, is the ring row's fingerprint.
func (r Ring) digest() string {
	sum := sha256.Sum256([]byte(r.encode()))
	return hex.EncodeToString(sum[:])
}

// describe names the ring and the start of its digest, for errors.
func (r Ring) describe() string { return fmt.Sprintf("%s (sha256 %.12s)", r, r.digest()) }

// predecessor returns the Stable ring a Moving ring was grown from.
func (r Ring) predecessor() Ring {
	return Ring{Version: r.Version - 1, Phase: RingStable, Homes: r.Previous}
}

// drops returns the homes of r that next does not have: rings only grow.
func (r Ring) drops(next Ring) []string {
	var out []string
	for _, id := range r.Homes {
		if !slices.Contains(next.Homes, id) {
			out = append(out, id)
		}
	}
	return out
}

// Rendezvous returns principal's home among ids by rendezvous hashing (part
// of ring format "d1idem-ring/1"): the ID with the highest first 8 bytes
// (big-endian) of SHA-256(principal || 0x00 || ID), on a tie the smaller; ""
// when ids is empty. An added ID wins about 1/(len(ids)+1) of the principals.
func Rendezvous(principal string, ids []string) string {
	best, bestScore := "", uint64(0)
	for _, id := range ids {
		s := score(principal, id)
		if best == "" || s > bestScore || (s == bestScore && id < best) {
			best, bestScore = id, s
		}
	}
	return best
}

func score(principal, id string) uint64 {
	h := sha256.New()
	h.Write([]byte(principal))
	h.Write([]byte{0})
	h.Write([]byte(id))
	var sum [sha256.Size]byte
	return binary.BigEndian.Uint64(h.Sum(sum[:0]))
}

// checkHomeID accepts 1 to 255 bytes of UTF-8 without control characters (nor NUL, for the hash).
func checkHomeID(id string) error {
	if id == "" || len(id) > maxHomeID || !utf8.ValidString(id) {
		return fmt.Errorf("idem: home ID %q: use 1 to %d bytes of UTF-8", id, maxHomeID)
	}
	for _, c := range id {
		if c < 0x20 || c == 0x7f {
			return fmt.Errorf("idem: home ID %q holds a control character", id)
		}
	}
	return nil
}

// ringJSON is the ring row's response_body.
type ringJSON struct {
	Format   string    `json:"format"`
	Version  int64     `json:"version"`
	Phase    RingPhase `json:"phase"`
	Homes    []string  `json:"homes"`
	Previous []string  `json:"previous,omitempty"`
}

// MarshalJSON writes the ring as version, phase, homes and previous ([]
// when Stable).
func (r Ring) MarshalJSON() ([]byte, error) {
	prev := r.Previous
	if prev == nil {
		prev = []string{}
	}
	return json.Marshal(struct {
		Version  int64     `json:"version"`
		Phase    RingPhase `json:"phase"`
		Homes    []string  `json:"homes"`
		Previous []string  `json:"previous"`
	}{r.Version, r.Phase, r.Homes, prev})
}

func (r Ring) encode() string {
	b, _ := json.Marshal(ringJSON{Format: ringFormat, Version: r.Version, Phase: r.Phase, Homes: r.Homes, Previous: r.Previous})
	return string(b)
}

// errBadRing is wrapped by every error about an unreadable recorded ring.
var errBadRing = errors.New("idem: the recorded ring is unreadable")

// decodeRing reads a ring row: its generation, fingerprint and JSON.
func decodeRing(epoch int64, digest, body string) (Ring, error) {
	r, err := decodeRingBody(body)
	switch {
	case err != nil:
		return Ring{}, err
	case r.Epoch() != epoch:
		return Ring{}, fmt.Errorf("%w: generation %d, but the ring %s is epoch %d", errBadRing, epoch, r, r.Epoch())
	case r.digest() != digest:
		return Ring{}, fmt.Errorf("%w: its fingerprint is not the digest of %s", errBadRing, r)
	}
	return r, nil
}

func decodeRingBody(body string) (Ring, error) {
	var j ringJSON
	if err := json.NewDecoder(strings.NewReader(body)).Decode(&j); err != nil {
		return Ring{}, fmt.Errorf("%w: %v", errBadRing, err)
	}
	if j.Format != ringFormat {
		return Ring{}, fmt.Errorf("%w: format %q, want %q (written by another version of d1idem?)", errBadRing, j.Format, ringFormat)
	}
	r := Ring{Version: j.Version, Phase: j.Phase, Homes: j.Homes, Previous: j.Previous}
	if err := r.validate(); err != nil {
		return Ring{}, fmt.Errorf("%w: %v", errBadRing, err)
	}
	return r, nil
}

// homeJSON is the identity row's response_body; ID is its fingerprint too.
type homeJSON struct {
	Format string          `json:"format"`
	ID     string          `json:"id"`
	Joined json.RawMessage `json:"joined"`
}

func encodeHome(id string, joined Ring) string {
	b, _ := json.Marshal(homeJSON{Format: homeFormat, ID: id, Joined: json.RawMessage(joined.encode())})
	return string(b)
}

// decodeHome reads an identity row (fingerprint: the ID) and returns the ring the home joined.
func decodeHome(id, body string) (Ring, error) {
	var j homeJSON
	if err := json.Unmarshal([]byte(body), &j); err != nil {
		return Ring{}, fmt.Errorf("%w: the identity row: %v", errBadRing, err)
	}
	if j.Format != homeFormat || j.ID != id {
		return Ring{}, fmt.Errorf("%w: the identity row of home %q has format %q and ID %q", errBadRing, id, j.Format, j.ID)
	}
	joined, err := decodeRingBody(string(j.Joined))
	if err != nil {
		return Ring{}, fmt.Errorf("the identity row of home %q: %w", id, err)
	}
	return joined, nil
}

// validate checks sorted, distinct, valid IDs; a Moving ring's Previous is a proper subset of Homes.
func (r Ring) validate() error {
	moving := r.Phase == RingMoving
	switch err := checkIDs(r.Homes); {
	case r.Version < 1:
		return fmt.Errorf("version %d", r.Version)
	case err != nil:
		return err
	case !moving && r.Phase != RingStable:
		return fmt.Errorf("phase %q", r.Phase)
	case !moving && r.Previous != nil:
		return errors.New("a stable ring with previous homes")
	case !moving:
		return nil
	case r.Version < 2:
		return errors.New("version 1 cannot be moving")
	}
	if err := checkIDs(r.Previous); err != nil {
		return err
	}
	if dropped := r.predecessor().drops(r); len(dropped) > 0 {
		return fmt.Errorf("previous home %q is not a home", dropped[0])
	}
	if len(r.Previous) >= len(r.Homes) {
		return errors.New("a moving ring that adds no home")
	}
	return nil
}

func checkIDs(ids []string) error {
	if len(ids) == 0 {
		return errors.New("no homes")
	}
	for i, id := range ids {
		if err := checkHomeID(id); err != nil {
			return err
		}
		if i > 0 && ids[i-1] >= id {
			return errors.New("homes not sorted and distinct")
		}
	}
	return nil
}
