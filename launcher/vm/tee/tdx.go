package tee

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/c8s-dev/c8s/guest/api/teeparam"
	"github.com/c8s-dev/c8s/launcher/config"
)

// TDX is Intel TDX: a tdx-guest object, given to QEMU as JSON (its quote
// generation socket is a QAPI SocketAddress, which has no dotted-key form
// QEMU 7.2 accepts for -object).
type TDX struct{}

// tdxObject is QEMU's tdx-guest object (qapi/qom.json TdxGuestProperties).
type tdxObject struct {
	QOMType               string        `json:"qom-type"`
	ID                    string        `json:"id"`
	MRConfigID            string        `json:"mrconfigid,omitempty"`
	QuoteGenerationSocket socketAddress `json:"quote-generation-socket"`
}

// socketAddress is QEMU's SocketAddress (qapi/sockets.json): a unix path
// or a vsock CID and port.
type socketAddress struct {
	Type string `json:"type"`
	CID  string `json:"cid,omitempty"`
	Port string `json:"port,omitempty"`
	Path string `json:"path,omitempty"`
}

// vsockHostCID is the host's vsock context ID.
const vsockHostCID = 2

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
	obj := tdxObject{
		QOMType:               "tdx-guest",
		ID:                    tdxObjectID,
		QuoteGenerationSocket: qgs,
	}
	if mrconfigid != nil {
		padded := make([]byte, tdxMRConfigID)
		copy(padded, mrconfigid)
		obj.MRConfigID = base64.StdEncoding.EncodeToString(padded)
	}
	objJSON, err := json.Marshal(obj)
	if err != nil {
		return Pieces{}, fmt.Errorf("tdx-guest object: %w", err)
	}
	return Pieces{
		MachineOptions: []string{"confidential-guest-support=" + tdxObjectID, "kernel-irqchip=split"},
		Args:           []string{"-object", string(objJSON)},
		Firmware:       h.Firmware,
		KernelParams:   TDX{}.KernelParams(),
		RequiresKVM:    true,
		QOMTypes:       []string{"tdx-guest"},
		Ports:          []string{KBSPort},
	}, nil
}

// parseQGS parses hypervisor.tdx.quote_generation_socket.
func parseQGS(s string) (socketAddress, error) {
	switch {
	case s == "":
		return socketAddress{Type: "unix", Path: defaultQGSocket}, nil
	case strings.HasPrefix(s, "vsock:"):
		port, err := strconv.ParseUint(strings.TrimPrefix(s, "vsock:"), 10, 32)
		if err != nil || port == 0 {
			return socketAddress{}, fmt.Errorf("hypervisor.tdx.quote_generation_socket %q: want vsock:<port> with a port 1..4294967295", s)
		}
		return socketAddress{Type: "vsock", CID: strconv.FormatUint(vsockHostCID, 10), Port: strconv.FormatUint(port, 10)}, nil
	case filepath.IsAbs(s):
		return socketAddress{Type: "unix", Path: s}, nil
	}
	return socketAddress{}, fmt.Errorf("hypervisor.tdx.quote_generation_socket %q: want an absolute unix socket path or vsock:<port>", s)
}
