package idem_test

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/d1idem/d1idem/d1client"
	"github.com/d1idem/d1idem/idem"
)

// A queue consumer: the queue delivers at least once (here the second
// message is delivered twice, as after a lost acknowledgement), and Do makes
// the effect happen once per message. The shipment row commits in the same
// D1 transaction as the ledger's result, so a crash between the two cannot
// lose one or double the other. An error (not final) leaves the key
// released: NACK, and the next delivery runs again; in progress: NACK with a
// delay.
func ExampleLedger_Do_queueConsumer() {
	db, cleanup := exampleDB()
	defer cleanup()
	ctx := context.Background()
	if _, err := db.Query(ctx, "CREATE TABLE shipments (order_id TEXT PRIMARY KEY)"); err != nil {
		panic(err)
	}
	ledger, _ := idem.New(db, idem.Config{})

	type message struct{ ID, OrderID string }
	deliveries := []message{{"m-1", "order-1"}, {"m-2", "order-2"}, {"m-2", "order-2"}}
	for _, msg := range deliveries {
		job := idem.Job{Principal: "shipments-queue", Key: msg.ID, Payload: []byte(msg.OrderID)}
		res, err := ledger.Do(ctx, job, func(ctx context.Context, run *idem.Run) ([]byte, error) {
			err := run.Add(d1client.Statement{SQL: "INSERT INTO shipments (order_id) VALUES (?)", Params: []any{msg.OrderID}})
			return []byte("shipped " + msg.OrderID), err
		})
		var busy *idem.InProgressError
		switch {
		case errors.As(err, &busy):
			fmt.Println(msg.ID, "nack, redeliver in", busy.RetryAfter)
		case err != nil:
			fmt.Println(msg.ID, "nack:", err)
		default:
			fmt.Printf("%s ack: %s (replayed: %v)\n", msg.ID, res.Value, res.Replayed)
		}
	}
	n, _ := db.Query(ctx, "SELECT count(*) FROM shipments")
	fmt.Println("shipments:", n.Rows[0][0])
	// Output:
	// m-1 ack: shipped order-1 (replayed: false)
	// m-2 ack: shipped order-2 (replayed: false)
	// m-2 ack: shipped order-2 (replayed: true)
	// shipments: 2
}

// A webhook receiver keyed by the sender's event ID: the signature is
// checked first (an unsigned request must not claim a key), then the event
// is handled once, however often the sender retries it. The principal is
// the sender, so two senders' event IDs never meet.
func ExampleLedger_Do_webhook() {
	db, cleanup := exampleDB()
	defer cleanup()
	ledger, _ := idem.New(db, idem.Config{})
	secret := []byte("whsec_example")
	sign := func(body []byte) string {
		m := hmac.New(sha256.New, secret)
		m.Write(body)
		return hex.EncodeToString(m.Sum(nil))
	}
	receive := func(ctx context.Context, eventID, signature string, body []byte) (int, string) {
		if !hmac.Equal([]byte(signature), []byte(sign(body))) {
			return 401, "bad signature"
		}
		job := idem.Job{Principal: "payments-provider", Key: eventID, Payload: body}
		res, err := ledger.Do(ctx, job, func(ctx context.Context, run *idem.Run) ([]byte, error) {
			return []byte("credited"), nil // the effect: credit the account
		})
		switch {
		case errors.Is(err, idem.ErrInProgress):
			return 409, "in progress" // the sender retries later
		case err != nil:
			return 500, err.Error()
		case res.Replayed:
			return 200, "already " + string(res.Value)
		}
		return 200, string(res.Value)
	}
	body := []byte(`{"type":"payment.succeeded","amount":500}`)
	fmt.Println(receive(context.Background(), "evt_1", sign(body), body))
	fmt.Println(receive(context.Background(), "evt_1", sign(body), body)) // the sender's retry
	fmt.Println(receive(context.Background(), "evt_2", "forged", body))
	// Output:
	// 200 credited
	// 200 already credited
	// 401 bad signature
}

// A scheduled job that must not run twice across replicas: every replica's
// scheduler fires, and the day's key lets one run it. The others see it in
// progress or done.
func ExampleLedger_Do_cron() {
	db, cleanup := exampleDB()
	defer cleanup()
	day := time.Date(2026, 12, 6, 0, 0, 0, 0, time.UTC)
	job := idem.Job{Principal: "cron", Key: "daily-report/" + day.Format(time.DateOnly)}

	var mu sync.Mutex
	var runs int
	var wg sync.WaitGroup
	for range 3 { // three replicas, one ledger each, one database
		replica, _ := idem.New(db, idem.Config{})
		wg.Go(func() {
			_, _, err := idem.DoJSON(context.Background(), replica, job, func(ctx context.Context, run *idem.Run) (int, error) {
				mu.Lock()
				runs++
				mu.Unlock()
				return 42, nil // rows in the report
			})
			if err != nil && !errors.Is(err, idem.ErrInProgress) {
				fmt.Println(err)
			}
		})
	}
	wg.Wait()
	later, _ := idem.New(db, idem.Config{})
	rows, res, _ := idem.DoJSON(context.Background(), later, job, func(ctx context.Context, run *idem.Run) (int, error) {
		return 0, errors.New("the day's report ran twice")
	})
	fmt.Println("runs:", runs, "report rows:", rows, "replayed:", res.Replayed)
	// Output:
	// runs: 1 report rows: 42 replayed: true
}
