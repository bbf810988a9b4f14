package sim

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"

	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
	"github.com/containerd/ttrpc"

	attestapi "github.com/c8s-dev/c8s/guest/api/attest/v1"
	simdigest "github.com/c8s-dev/c8s/measurements/sim"
	"github.com/c8s-dev/c8s/measurements/snp"
)

// VCPUType is the vCPU model whose signature sim VMSAs carry; c8s-measure
// sim and the image manifest use the same.
const VCPUType = "EPYC-v4"

// Launch is what a sim VM is started with.
type Launch struct {
	Firmware, Kernel, Initrd, Cmdline string
	VCPUs                             int
}

// LaunchFromArgv reads a Launch from a QEMU argv (-bios, -kernel,
// -initrd, -append, -smp), so that what is measured is what QEMU is given.
func LaunchFromArgv(argv []string) (Launch, error) {
	var l Launch
	l.VCPUs = 1
	for i := 0; i+1 < len(argv); i++ {
		v := argv[i+1]
		switch argv[i] {
		case "-bios":
			l.Firmware = v
		case "-kernel":
			l.Kernel = v
		case "-initrd":
			l.Initrd = v
		case "-append":
			l.Cmdline = v
		case "-smp":
			n, err := bootVCPUs(v)
			if err != nil {
				return l, err
			}
			l.VCPUs = n
		default:
			continue
		}
		i++
	}
	switch {
	case l.Firmware == "":
		return l, errors.New("sim: the QEMU command line has no -bios: the sim measurement needs the firmware file")
	case l.Kernel == "":
		return l, errors.New("sim: the QEMU command line has no -kernel: sim pod VMs boot their kernel directly")
	}
	return l, nil
}

// bootVCPUs reads the vCPUs a VM boots with from -smp ("2",
// "2,maxcpus=4" or "cpus=2,maxcpus=4"): those are the measured ones, one
// VMSA each, as in SNP; vCPUs hot-plugged later (up to maxcpus) are not.
func bootVCPUs(smp string) (int, error) {
	for i, opt := range strings.Split(smp, ",") {
		k, val, isKV := strings.Cut(opt, "=")
		if !isKV && i == 0 {
			val = k
		} else if k != "cpus" {
			continue
		}
		n, err := strconv.Atoi(val)
		if err != nil || n < 1 {
			break
		}
		return n, nil
	}
	return 0, fmt.Errorf("sim: -smp %q: want a vCPU count", smp)
}

// Measure hashes the launch's files now and returns its sim launch digest.
func Measure(l Launch) (snp.Digest, error) {
	fw, err := os.ReadFile(l.Firmware)
	if err != nil {
		return snp.Digest{}, fmt.Errorf("sim: firmware: %w", err)
	}
	kernel, err := hashFile(l.Kernel)
	if err != nil {
		return snp.Digest{}, fmt.Errorf("sim: kernel: %w", err)
	}
	initrd := sha256.Sum256(nil)
	if l.Initrd != "" {
		if initrd, err = hashFile(l.Initrd); err != nil {
			return snp.Digest{}, fmt.Errorf("sim: initrd: %w", err)
		}
	}
	sig, err := snp.VCPUTypeSig(VCPUType)
	if err != nil {
		return snp.Digest{}, err
	}
	return simdigest.LaunchDigest(simdigest.Params{
		Firmware: fw,
		Kernel:   snp.KernelHashes{Kernel: kernel, Initrd: initrd, Cmdline: snp.CmdlineHash(l.Cmdline)},
		VCPUSig:  sig,
	}, l.VCPUs)
}

func hashFile(path string) ([sha256.Size]byte, error) {
	var d [sha256.Size]byte
	f, err := os.Open(path)
	if err != nil {
		return d, err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return d, err
	}
	h.Sum(d[:0])
	return d, nil
}

// Service is the simulated secure processor of one VM.
type Service struct {
	SP          *SP
	Measurement snp.Digest
	// HostData is the VM's HOST_DATA (the digest of its init data).
	HostData [32]byte
	// EventLog is the VM's simulated boot log (BootLog) and RTMRs the
	// registers it replays to; with no log, reports carry no RTMRs.
	EventLog []byte
	RTMRs    [4][48]byte
}

var _ attestapi.SimSPService = (*Service)(nil)

// GetReport signs a report binding the VM's measurement and host data to
// the guest's report data.
func (s *Service) GetReport(_ context.Context, r *attestapi.GetReportRequest) (*attestapi.GetReportResponse, error) {
	if len(r.ReportData) > 64 {
		return nil, errgrpc.ToGRPC(fmt.Errorf("report_data has %d bytes, at most 64: %w", len(r.ReportData), errdefs.ErrInvalidArgument))
	}
	req := Request{Measurement: s.Measurement, HostData: s.HostData, VMPL: r.Vmpl}
	copy(req.ReportData[:], r.ReportData)
	report, err := s.SP.Report(req)
	if err != nil {
		return nil, errgrpc.ToGRPC(err)
	}
	resp := &attestapi.GetReportResponse{Report: report, CertTable: s.SP.CertTable()}
	if len(s.EventLog) > 0 {
		if resp.RtmrStatement, err = s.SP.RTMRStatement(report, s.RTMRs); err != nil {
			return nil, errgrpc.ToGRPC(err)
		}
		resp.EventLog = s.EventLog
	}
	return resp, nil
}

// Serve answers the guest's requests on conn (the host end of the VM's
// attestation port) until conn closes or ctx ends.
func Serve(ctx context.Context, conn net.Conn, svc *Service) error {
	srv, err := ttrpc.NewServer()
	if err != nil {
		return err
	}
	attestapi.RegisterSimSPService(srv, svc)
	l := &oneConn{conn: conn, done: make(chan struct{})}
	go func() {
		<-ctx.Done()
		srv.Close()
	}()
	err = srv.Serve(ctx, l)
	if errors.Is(err, ttrpc.ErrServerClosed) || errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}

// oneConn is a listener that hands out one connection, then blocks until
// closed.
type oneConn struct {
	conn net.Conn
	once sync.Once
	done chan struct{}
	used bool
	mu   sync.Mutex
}

func (l *oneConn) Accept() (net.Conn, error) {
	l.mu.Lock()
	if !l.used {
		l.used = true
		l.mu.Unlock()
		return l.conn, nil
	}
	l.mu.Unlock()
	<-l.done
	return nil, net.ErrClosed
}

func (l *oneConn) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *oneConn) Addr() net.Addr { return l.conn.LocalAddr() }
