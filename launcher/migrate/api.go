package migrate

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"time"

	"github.com/c8s-dev/c8s/launcher/attest/verdict"
	"github.com/c8s-dev/c8s/launcher/vm"
)

// The destination API, HTTP/JSON on the Server's unix socket:
//
//	GET    /v1/node            NodeInfo
//	POST   /v1/incoming        IncomingRequest -> IncomingResponse
//	GET    /v1/vms/{id}        VMStatus
//	GET    /v1/vms/{id}/wait   VMStatus, once the VM has exited
//	DELETE /v1/vms/{id}        stops the VM and removes its state
//	POST   /v1/vms/{id}/agent  Upgrade: c8s-agent, then the VM's agent channel
//	POST   /v1/relay?to=H:P    Upgrade: c8s-tls-relay, then a mutual-TLS
//	                           connection to H:P (unix socket only; relay.go)
//
// Errors are {"error": "..."} with a 4xx or 5xx status.

// IncomingRequest asks a destination to prepare for a pod VM.
type IncomingRequest struct {
	// ID is the VM's id (the sandbox id).
	ID string `json:"id"`
	// Source describes the sending node; the destination runs the same
	// preflight.
	Source NodeInfo `json:"source"`
	Shape  Shape    `json:"shape"`
	// MinTCB is the pod's minimum TCB (attestation.min_tcb).
	MinTCB uint64 `json:"min_tcb,omitempty"`
	// KernelParams are the pod's extra kernel parameters (measured).
	KernelParams string `json:"kernel_params,omitempty"`
	// Accel is the source VM's accelerator; the destination uses the same.
	Accel string `json:"accel"`
	// Disks are attached at their SCSI targets 0..n-1, in order. The
	// paths of those that Layers does not name must be reachable from the
	// destination (shared storage).
	Disks []vm.Disk `json:"disks,omitempty"`
	// Layers names the disks that are image layers: the destination
	// attaches its own copy of each (layers.go).
	Layers []Layer `json:"layers,omitempty"`
	// Namespace is the pod's containerd namespace on the source, where
	// the destination looks for a layer's blob to convert.
	Namespace string `json:"namespace,omitempty"`
	// VsockCID is the source's vsock CID (0: virtio-serial agent port).
	VsockCID uint32 `json:"vsock_cid,omitempty"`
	// HostData is the VM's HOST_DATA, which migrates with the guest
	// context; the destination's secure processor reports it.
	HostData verdict.Hex `json:"host_data,omitempty"`
}

// IncomingResponse says where the destination listens.
type IncomingResponse struct {
	ID string `json:"id"`
	// URI is the migrate URI for the source ("tcp:HOST:PORT").
	URI string `json:"uri"`
	// TLS says the destination QEMU expects the stream under TLS with a
	// pool member's client certificate (see stream.go); false only for a
	// plain stream on loopback that migration.plain_loopback allows.
	TLS bool `json:"tls"`
	// AgentSocket is the destination VM's agent channel (virtio-serial).
	AgentSocket string `json:"agent_socket"`
	// StateDir is the destination VM's state directory.
	StateDir string `json:"state_dir"`
	// Pid is the destination QEMU's pid.
	Pid int `json:"pid"`
	// Node is the destination's NodeInfo.
	Node NodeInfo `json:"node"`
}

// VMStatus is the state of a VM a destination runs.
type VMStatus struct {
	ID       string `json:"id"`
	Pid      int    `json:"pid"`
	RunState string `json:"run_state,omitempty"`
	Exited   bool   `json:"exited"`
	// Error says why the VM exited on its own ("" after a stop).
	Error string `json:"error,omitempty"`
}

// Client talks to a destination's Server on behalf of the source node.
type Client struct {
	socket string // what the client dials, for errors
	dial   func(ctx context.Context) (net.Conn, error)

	// streamIdentity is the source node's migration TLS identity (a
	// directory as statedir.MigrateTLS) that its QEMU presents on the
	// migration stream; plainLoopback accepts a plain stream on loopback.
	streamIdentity string
	plainLoopback  bool
}

// WithStream sets the source node's migration TLS identity, the directory
// (statedir.MigrateTLS) whose certificate the source QEMU presents on the
// migration stream, and whether a destination's plain stream on loopback
// is acceptable (migration.plain_loopback). Dial sets both from the node's
// configuration. It returns c.
func (c *Client) WithStream(identityDir string, plainLoopback bool) *Client {
	c.streamIdentity, c.plainLoopback = identityDir, plainLoopback
	return c
}

// NewClient returns a client for the Server on the unix socket path.
func NewClient(socket string) *Client {
	return newClient(socket, func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", socket)
	})
}

func newClient(name string, dial func(ctx context.Context) (net.Conn, error)) *Client {
	return &Client{socket: name, dial: dial}
}

// Address is the server's address: its unix socket path or
// tls://HOST:PORT.
func (c *Client) Address() string { return c.socket }

// Node returns the destination's NodeInfo.
func (c *Client) Node(ctx context.Context) (NodeInfo, error) {
	var n NodeInfo
	err := c.do(ctx, http.MethodGet, "/v1/node", nil, &n)
	return n, err
}

// Incoming asks the destination to start QEMU for req and listen.
func (c *Client) Incoming(ctx context.Context, req IncomingRequest) (IncomingResponse, error) {
	var r IncomingResponse
	err := c.do(ctx, http.MethodPost, "/v1/incoming", req, &r)
	return r, err
}

// Status returns the state of the destination VM id.
func (c *Client) Status(ctx context.Context, id string) (VMStatus, error) {
	var s VMStatus
	err := c.do(ctx, http.MethodGet, "/v1/vms/"+url.PathEscape(id), nil, &s)
	return s, err
}

// Wait returns once the destination VM id has exited (or ctx ends).
func (c *Client) Wait(ctx context.Context, id string) (VMStatus, error) {
	var s VMStatus
	err := c.do(ctx, http.MethodGet, "/v1/vms/"+url.PathEscape(id)+"/wait", nil, &s)
	return s, err
}

// Delete stops the destination VM id and removes its state. A VM the
// destination does not know is not an error.
func (c *Client) Delete(ctx context.Context, id string) error {
	return c.do(ctx, http.MethodDelete, "/v1/vms/"+url.PathEscape(id), nil, nil)
}

// ErrNotFound is returned for a VM the destination does not know.
var ErrNotFound = errors.New("not found")

// ErrConflict is returned when the destination answers 409 (it already
// runs the VM, or its preflight or a layer conflicts), before it started
// any QEMU for the request.
var ErrConflict = errors.New("conflict")

func (c *Client) do(ctx context.Context, method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://c8s-migrate"+path, body)
	if err != nil {
		return err
	}
	resp, b, err := c.roundTrip(ctx, req) // client.go
	if err != nil {
		return fmt.Errorf("destination %s: %s %s: %w", c.socket, method, path, err)
	}
	if resp.StatusCode/100 != 2 {
		var e struct {
			Error string `json:"error"`
		}
		_ = json.Unmarshal(b, &e)
		if e.Error == "" {
			e.Error = resp.Status
		}
		err := fmt.Errorf("destination %s: %s", c.socket, e.Error)
		switch resp.StatusCode {
		case http.StatusNotFound:
			err = fmt.Errorf("%w (%w)", err, ErrNotFound)
		case http.StatusConflict:
			err = fmt.Errorf("%w (%w)", err, ErrConflict)
		}
		return err
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(b, out); err != nil {
		return fmt.Errorf("destination %s: decoding the answer to %s %s: %w", c.socket, method, path, err)
	}
	return nil
}

// writeJSON and writeError are the server's answers.
func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, code int, err error) {
	writeJSON(w, code, map[string]string{"error": err.Error()})
}

// requestTimeout bounds the server's work for one request.
const requestTimeout = 2 * time.Minute

// agentUpgrade is the protocol name of the agent tunnel (POST
// /v1/vms/{id}/agent with Upgrade): after the 101 answer the connection
// carries the VM's agent channel, so the source node never needs the
// destination's file system.
const agentUpgrade = "c8s-agent"

// DialAgent opens a tunnel to the agent channel of the destination VM id.
func (c *Client) DialAgent(ctx context.Context, id string) (net.Conn, error) {
	conn, err := c.dial(ctx)
	if err != nil {
		return nil, fmt.Errorf("destination %s: %w", c.socket, err)
	}
	tunnel, err := upgrade(ctx, conn, "/v1/vms/"+url.PathEscape(id)+"/agent", agentUpgrade)
	if err != nil {
		return nil, fmt.Errorf("destination %s: agent tunnel: %w", c.socket, err)
	}
	return tunnel, nil
}

// upgrade asks the server on conn to turn it into protocol proto (POST
// path with Upgrade) and returns the connection, which carries proto once
// the server answered 101. conn is closed on error.
func upgrade(ctx context.Context, conn net.Conn, path, proto string) (net.Conn, error) {
	if dl, ok := ctx.Deadline(); ok {
		conn.SetDeadline(dl)
	}
	req, err := http.NewRequest(http.MethodPost, "http://c8s-migrate"+path, nil)
	if err != nil {
		conn.Close()
		return nil, err
	}
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", proto)
	br := bufio.NewReader(conn)
	resp, err := func() (*http.Response, error) {
		if err := req.Write(conn); err != nil {
			return nil, err
		}
		return http.ReadResponse(br, req)
	}()
	if err != nil {
		conn.Close()
		return nil, contextErr(ctx, err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		resp.Body.Close()
		conn.Close()
		var e struct {
			Error string `json:"error"`
		}
		if json.Unmarshal(b, &e) != nil || e.Error == "" {
			e.Error = string(bytes.TrimSpace(b))
		}
		return nil, fmt.Errorf("%s: %s", resp.Status, e.Error)
	}
	conn.SetDeadline(time.Time{})
	return &bufferedConn{Conn: conn, r: br}, nil
}

// bufferedConn reads what the HTTP reader buffered first.
type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufferedConn) Read(b []byte) (int, error) { return c.r.Read(b) }
