package tee

import (
	"encoding/base64"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"

	govmm "github.com/kata-containers/kata-containers/src/runtime/pkg/govmm/qemu"

	"github.com/c8s-dev/c8s/guest/api/teeparam"
	"github.com/c8s-dev/c8s/launcher/config"
)

// TDX is Intel TDX. The tdx-guest object is rendered as JSON with govmm's
// TdxQomObject/SocketAddress types rather than its Object (TDXGuest),
// because Object hard-codes the quote generation socket path.
type TDX struct{}

func init() { Register(TDX{}) }

const (
	tdxObjectID     = "tdx0"
	tdxMRConfigID   = 48
	defaultQGSocket = "/var/run/tdx-qgs/qgs.socket"
)

// Name implements Backend.
func (TDX) Name() string { return teeparam.TDX }

// KernelParams implements Backend: c8s.tee=tdx.
func (TDX) KernelParams() []string { return []string{teeparam.Format(teeparam.TDX)} }

// QEMU implements Backend.
func (TDX) QEMU(h config.Hypervisor) (Pieces, error) {
	if h.Firmware == "" {
		return Pieces{}, errors.New("tee tdx needs hypervisor.firmware (a TDVF/OVMF built with TDX support)")
	}
	mrconfigid, err := decodeHex("hypervisor.tdx.mrconfigid", h.TDX.MRConfigID, tdxMRConfigID, false)
	if err != nil {
		return Pieces{}, err
	}
	qgs, err := parseQGS(h.TDX.QuoteGenerationSocket)
	if err != nil {
		return Pieces{}, err
	}
	obj := govmm.TdxQomObject{
		QomType:               string(govmm.TDXGuest),
		Id:                    tdxObjectID,
		QuoteGenerationSocket: qgs,
	}
	if mrconfigid != nil {
		padded := make([]byte, tdxMRConfigID)
		copy(padded, mrconfigid)
		obj.MrConfigId = base64.StdEncoding.EncodeToString(padded)
	}
	return Pieces{
		MachineOptions: []string{"confidential-guest-support=" + tdxObjectID, "kernel-irqchip=split"},
		Args:           []string{"-object", obj.String()},
		Firmware:       h.Firmware,
		KernelParams:   TDX{}.KernelParams(),
		RequiresKVM:    true,
		QOMTypes:       []string{"tdx-guest"},
		Ports:          []string{KBSPort},
	}, nil
}

// parseQGS parses hypervisor.tdx.quote_generation_socket.
func parseQGS(s string) (govmm.SocketAddress, error) {
	switch {
	case s == "":
		return govmm.SocketAddress{Type: "unix", Path: defaultQGSocket}, nil
	case strings.HasPrefix(s, "vsock:"):
		port, err := strconv.ParseUint(strings.TrimPrefix(s, "vsock:"), 10, 32)
		if err != nil || port == 0 {
			return govmm.SocketAddress{}, fmt.Errorf("hypervisor.tdx.quote_generation_socket %q: want vsock:<port> with a port 1..4294967295", s)
		}
		return govmm.SocketAddress{Type: "vsock", Cid: strconv.FormatUint(govmm.VsockHostCid, 10), Port: strconv.FormatUint(port, 10)}, nil
	case filepath.IsAbs(s):
		return govmm.SocketAddress{Type: "unix", Path: s}, nil
	}
	return govmm.SocketAddress{}, fmt.Errorf("hypervisor.tdx.quote_generation_socket %q: want an absolute unix socket path or vsock:<port>", s)
}
