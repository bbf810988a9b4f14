package attest

import (
	"bytes"
	"context"
	"errors"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/containerd/ttrpc"
	"github.com/google/go-sev-guest/abi"
	sevtest "github.com/google/go-sev-guest/testing"

	attestapi "github.com/c8s-dev/c8s/guest/api/attest/v1"
)

// fakeSP stands in for the launcher's simulated secure processor: it
// answers with an unsigned report in the ABI layout carrying the request's
// REPORT_DATA (the real, signing SP is the launcher's).
type fakeSP struct {
	mu       sync.Mutex
	requests []*attestapi.GetReportRequest
	// answer, when set, replaces the report.
	answer func(req *attestapi.GetReportRequest) []byte
}

func (f *fakeSP) GetReport(_ context.Context, req *attestapi.GetReportRequest) (*attestapi.GetReportResponse, error) {
	f.mu.Lock()
	f.requests = append(f.requests, req)
	answer := f.answer
	f.mu.Unlock()
	var n [64]byte
	copy(n[:], req.GetReportData())
	r := sevtest.TestRawReport(n)
	report := r[:abi.ReportSize]
	if answer != nil {
		report = answer(req)
	}
	return &attestapi.GetReportResponse{Report: report, CertTable: []byte("sim cert table")}, nil
}

// countingListener counts connections and can drop them all, as a host
// that disconnects.
type countingListener struct {
	net.Listener
	mu    sync.Mutex
	conns []net.Conn
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.mu.Lock()
		l.conns = append(l.conns, c)
		l.mu.Unlock()
	}
	return c, err
}

func (l *countingListener) accepted() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.conns)
}

func (l *countingListener) dropAll() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range l.conns {
		c.Close()
	}
}

// serveSP serves sp over a unix socket and returns a Sim provider that
// dials it in place of the port device.
func serveSP(t testing.TB, sp *fakeSP) (*Sim, *countingListener) {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "attest.sock")
	ul, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	l := &countingListener{Listener: ul}
	srv, err := ttrpc.NewServer()
	if err != nil {
		t.Fatal(err)
	}
	attestapi.RegisterSimSPService(srv, sp)
	go srv.Serve(context.Background(), l)
	t.Cleanup(func() { srv.Close() })
	s := NewSim("/fixture/dev/vport1p2")
	s.dial = func(path string) (net.Conn, error) {
		if path != "/fixture/dev/vport1p2" {
			return nil, &unexpectedPath{path}
		}
		return net.Dial("unix", sock)
	}
	t.Cleanup(func() { s.Close() })
	return s, l
}

func TestSimEvidenceOneConnection(t *testing.T) {
	sp := &fakeSP{}
	s, l := serveSP(t, sp)
	for i := range 3 {
		n := nonce(byte(20 + i))
		ev, err := s.Evidence(context.Background(), n)
		if err != nil {
			t.Fatal(err)
		}
		if ev.Kind != KindSNP || ev.Provider != NameSim || s.Name() != NameSim {
			t.Errorf("kind %q provider %q name %q", ev.Kind, ev.Provider, s.Name())
		}
		r, err := abi.ReportToProto(ev.Report)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(r.GetReportData(), n[:]) {
			t.Errorf("REPORT_DATA = %x, want the nonce %x", r.GetReportData(), n)
		}
		if string(ev.CertTable) != "sim cert table" {
			t.Errorf("cert table = %q", ev.CertTable)
		}
	}
	if got := l.accepted(); got != 1 {
		t.Errorf("%d connections for 3 reports; the port is one stream and must carry one client", got)
	}
	sp.mu.Lock()
	defer sp.mu.Unlock()
	for _, req := range sp.requests {
		if req.GetVmpl() != 0 || len(req.GetReportData()) != 64 {
			t.Errorf("request vmpl %d, %d bytes of report data", req.GetVmpl(), len(req.GetReportData()))
		}
	}
}

func TestSimReconnectsAfterHostDisconnect(t *testing.T) {
	s, l := serveSP(t, &fakeSP{})
	if _, err := s.Evidence(context.Background(), nonce(1)); err != nil {
		t.Fatal(err)
	}
	l.dropAll()
	n := nonce(2)
	ev, err := s.Evidence(context.Background(), n)
	if err != nil {
		t.Fatalf("no evidence after the host reconnected: %v", err)
	}
	if got := ev.Report[snpReportDataOffset : snpReportDataOffset+64]; !bytes.Equal(got, n[:]) {
		t.Errorf("REPORT_DATA = %x, want %x", got, n)
	}
	if got := l.accepted(); got != 2 {
		t.Errorf("%d connections, want 2 (one per host connection)", got)
	}
}

func TestSimRejectsWrongReports(t *testing.T) {
	sp := &fakeSP{}
	s, _ := serveSP(t, sp)
	sp.answer = func(*attestapi.GetReportRequest) []byte {
		r := sevtest.TestRawReport(nonce(99))
		return r[:abi.ReportSize]
	}
	if _, err := s.Evidence(context.Background(), nonce(1)); err == nil || !strings.Contains(err.Error(), "REPORT_DATA") {
		t.Errorf("report for another nonce: err = %v", err)
	}
	sp.answer = func(req *attestapi.GetReportRequest) []byte { return req.GetReportData() }
	if _, err := s.Evidence(context.Background(), nonce(1)); err == nil || !strings.Contains(err.Error(), "64 bytes, not the 1184") {
		t.Errorf("truncated report: err = %v", err)
	}
}

func TestSimNoHost(t *testing.T) {
	s := NewSim("/fixture/dev/vport1p2")
	s.dial = func(string) (net.Conn, error) {
		return nil, errors.New("open virtio-serial port /fixture/dev/vport1p2: no such device")
	}
	if _, err := s.Evidence(context.Background(), nonce(1)); err == nil || !strings.Contains(err.Error(), "/fixture/dev/vport1p2") {
		t.Errorf("no port: err = %v", err)
	}
	// A port nobody serves: the caller's context ends the wait.
	s.dial = func(string) (net.Conn, error) {
		guest, host := net.Pipe()
		t.Cleanup(func() { host.Close() })
		return guest, nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := s.Evidence(ctx, nonce(1))
	if err == nil || !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), SimPortName) {
		t.Errorf("unserved port: err = %v, want the cancellation and a hint about %s", err, SimPortName)
	}
	s.Close()
}

// BenchmarkSimEvidence is one GetReport round trip over a unix socket to
// an in-process SimSP that does not sign: the guest side's own cost.
func BenchmarkSimEvidence(b *testing.B) {
	s, _ := serveSP(b, &fakeSP{})
	n := nonce(5)
	for b.Loop() {
		if _, err := s.Evidence(context.Background(), n); err != nil {
			b.Fatal(err)
		}
	}
}
