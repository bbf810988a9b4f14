package migrate

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"
)

// The Client speaks HTTP/1.1 itself, one request per connection from its
// dial function, with net/http's Request.Write and ReadResponse but
// without http.Client and http.Transport: every pod's shim links this
// package (a pod may be migrated), and the Transport brings HTTP/2, proxy
// and TLS dialling code, about 0.6 MB of the shim's binary and of its
// resident memory (issue 18). Keeping connections alive would save
// nothing: a migration's calls run concurrently (Node and Incoming), or
// hold their connection (Wait, the agent tunnel).

// maxAnswer bounds an answer's body.
const maxAnswer = 1 << 20

// errAnswerTooLarge is an answer body over maxAnswer.
var errAnswerTooLarge = fmt.Errorf("the answer is larger than %d bytes", maxAnswer)

// roundTrip sends req on a new connection and returns the answer's status
// and body. When ctx ends first the connection is cut and the error wraps
// ctx.Err().
func (c *Client) roundTrip(ctx context.Context, req *http.Request) (*http.Response, []byte, error) {
	conn, err := c.dial(ctx)
	if err != nil {
		return nil, nil, contextErr(ctx, err)
	}
	defer conn.Close()
	// Cut the connection when ctx ends: a Wait blocks until the VM exits.
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	req.Close = true // "Connection: close": the connection is not reused
	if err := req.Write(conn); err != nil {
		return nil, nil, contextErr(ctx, err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), req)
	if err != nil {
		return nil, nil, contextErr(ctx, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswer+1))
	if err != nil {
		return nil, nil, contextErr(ctx, fmt.Errorf("reading the answer: %w", err))
	}
	if len(body) > maxAnswer {
		return nil, nil, errAnswerTooLarge
	}
	return resp, body, nil
}

// contextErr returns err, or once ctx has ended an error that wraps
// ctx.Err() (callers tell a cancelled call from a lost destination).
func contextErr(ctx context.Context, err error) error {
	if ctx.Err() != nil && !errors.Is(err, ctx.Err()) {
		return fmt.Errorf("%w (%v)", ctx.Err(), err)
	}
	return err
}
