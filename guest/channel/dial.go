package channel

import (
	"net"
	"os"
	"time"
)

// DialPort opens the virtio-serial port at path as a client connection, for
// ports on which the host serves and the guest speaks first (the
// attestation port c8s.attest). Unlike SerialListener it interprets nothing
// in the byte stream: the connection is the port, and closing it closes the
// port. A read returns io.EOF while no host is connected to the port.
func DialPort(path string) (net.Conn, error) {
	f, err := openPort(path)
	if err != nil {
		return nil, err
	}
	return &portConn{f: f, name: path}, nil
}

// portConn is an open port as a net.Conn.
type portConn struct {
	f    *os.File
	name string
}

func (c *portConn) Read(b []byte) (int, error)         { return c.f.Read(b) }
func (c *portConn) Write(b []byte) (int, error)        { return c.f.Write(b) }
func (c *portConn) Close() error                       { return c.f.Close() }
func (c *portConn) LocalAddr() net.Addr                { return serialAddr(c.name) }
func (c *portConn) RemoteAddr() net.Addr               { return serialAddr("host") }
func (c *portConn) SetDeadline(t time.Time) error      { return c.f.SetDeadline(t) }
func (c *portConn) SetReadDeadline(t time.Time) error  { return c.f.SetReadDeadline(t) }
func (c *portConn) SetWriteDeadline(t time.Time) error { return c.f.SetWriteDeadline(t) }
