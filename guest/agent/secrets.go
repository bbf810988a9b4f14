package agent

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/c8s-dev/c8s/guest/api/initdata"
	kbsapi "github.com/c8s-dev/c8s/guest/api/kbs"
	"github.com/c8s-dev/c8s/guest/kbs"
	"github.com/c8s-dev/c8s/guest/policy"
)

// SecretsDir is where the guest keeps the pod's secrets: a tmpfs of its
// own, in guest memory, never on a disk and never sent to the host.
const SecretsDir = "/run/c8s/secrets"

// secretRetry bounds the broker handshake: about 15 s of trying in all
// before the pod fails.
var secretRetry = kbs.Retry{Attempts: 5, Backoff: time.Second}

// secretMount is one fetched secret: its [[kbs.secrets]] resource, its
// guest file and its container path.
type secretMount struct {
	resource, source, destination string
}

// MountSecretsTmpfs is the guest's MountSecrets: a tmpfs only root can
// enter, not swappable (the guest has no swap), sized for secrets.
func MountSecretsTmpfs(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	if !sameDev(dir, filepath.Dir(dir)) {
		return nil // already mounted (a second pod start in one VM)
	}
	if err := unix.Mount("c8s-secrets", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=0711,size=16m"); err != nil {
		return fmt.Errorf("mount the secrets tmpfs on %s: %w", dir, err)
	}
	return nil
}

func sameDev(a, b string) bool {
	var sa, sb unix.Stat_t
	if unix.Stat(a, &sa) != nil || unix.Stat(b, &sb) != nil {
		return false
	}
	return sa.Dev == sb.Dev
}

// fetchSecrets gets the secrets the pod's init data names from its key
// broker, once per pod, and keeps them on the secrets tmpfs. Calls are
// serialized: SetInitData again, while or after the first ran, neither
// runs another handshake (a session the broker holds for each) nor
// rewrites a secret a container reads.
func (s *Service) fetchSecrets(ctx context.Context, doc *initdata.InitData, raw []byte, tee string) error {
	k := doc.KBS
	if k.URL == "" || len(k.Secrets) == 0 {
		return nil
	}
	s.fetching.Lock()
	defer s.fetching.Unlock()
	s.mu.Lock()
	done := s.secrets != nil
	s.mu.Unlock()
	if done {
		return nil // a re-attestation hands the same init data again
	}
	roots, err := k.CertPool()
	if err != nil {
		return err
	}
	// Registry credentials only pulls use are fetched by the pull
	// (pull.go: pullOnlyCredentials).
	pullOnly := pullOnlyCredentials(doc)
	var paths []string
	var secrets []initdata.Secret
	for _, sec := range k.Secrets {
		p, err := sec.ResourcePath()
		if err != nil {
			return err
		}
		if !pullOnly[p] {
			paths, secrets = append(paths, p), append(secrets, sec)
		}
	}
	if len(paths) == 0 {
		return nil
	}
	if tee != kbsapi.TeeSNP && tee != kbsapi.TeeTDX {
		return fmt.Errorf("key broker attestation with %q evidence is not supported (snp or tdx): %w", tee, errdefs.ErrNotImplemented)
	}
	c := &kbs.Client{URL: k.URL, Roots: roots, Dial: s.cfg.KBSDial, Tee: tee, InitData: raw, Evidence: s.kbsEvidence}
	retry := secretRetry
	retry.Log = func(attempt int, err error, wait time.Duration) {
		log.G(ctx).WithError(err).WithField("attempt", attempt).WithField("retry_in", wait).Warn("key broker: retrying")
	}
	t0 := time.Now()
	values, err := c.FetchRetry(ctx, paths, retry)
	if err != nil {
		return fmt.Errorf("get the pod's secrets from the key broker %s: %w: %w", k.URL, err, errdefs.ErrPermissionDenied)
	}
	if err := s.cfg.MountSecrets(s.cfg.SecretsDir); err != nil {
		return err
	}
	var mounts []secretMount
	for i, v := range values {
		file := filepath.Join(s.cfg.SecretsDir, strconv.Itoa(i))
		err := keepSecret(file, v)
		clear(v)
		if err != nil {
			return fmt.Errorf("keep secret %s: %w", paths[i], err)
		}
		mounts = append(mounts, secretMount{resource: secrets[i].Resource, source: file, destination: secrets[i].Path})
	}
	s.mu.Lock()
	s.secrets = mounts
	s.mu.Unlock()
	log.G(ctx).WithField("resources", paths).WithField("took", time.Since(t0).Round(time.Millisecond)).Info("key broker released the pod's secrets")
	return nil
}

// keepSecret writes a secret's file whole, mode 0444: to a file of its
// own, renamed into place, so that no reader ever sees it partly written.
func keepSecret(file string, v []byte) error {
	tmp := file + ".new"
	if err := os.WriteFile(tmp, v, 0o400); err != nil {
		return err
	}
	if err := os.Chmod(tmp, 0o444); err != nil {
		return err
	}
	return os.Rename(tmp, file)
}

// kbsEvidence is the broker client's evidence with reportData bound, in
// the encoding Trustee's verifier for its TEE reads: snp (the sim TEE
// included: its reports are SNP reports, signed by the node's simulated
// AMD root) or tdx.
func (s *Service) kbsEvidence(ctx context.Context, reportData [64]byte) (string, []byte, error) {
	ev, err := s.cfg.Evidence(ctx, reportData)
	if err != nil {
		return "", nil, err
	}
	switch ev.Kind {
	case kbsapi.TeeSNP:
		e, err := kbsapi.NewSNPEvidence(ev.Report, ev.CertTable)
		if err != nil {
			return "", nil, err
		}
		b, err := json.Marshal(e)
		return kbsapi.TeeSNP, b, err
	case kbsapi.TeeTDX:
		e := kbsapi.TDXEvidence{Quote: base64.StdEncoding.EncodeToString(ev.Report)}
		if len(ev.EventLog) > 0 {
			l := base64.StdEncoding.EncodeToString(ev.EventLog)
			e.CCEventLog = &l
		}
		b, err := json.Marshal(e)
		return kbsapi.TeeTDX, b, err
	}
	return "", nil, fmt.Errorf("key broker attestation with %q evidence is not supported (snp or tdx): %w", ev.Kind, errdefs.ErrNotImplemented)
}

// secretPaths are the fetched secrets' [[kbs.secrets]] paths, by
// resource (every entry's: secretMounts binds each), for the policy to
// check where they will be mounted.
func (s *Service) secretPaths() map[string][]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.secrets) == 0 {
		return nil
	}
	paths := make(map[string][]string, len(s.secrets))
	for _, m := range s.secrets {
		paths[m.resource] = append(paths[m.resource], m.destination)
	}
	return paths
}

// secretMounts are the read-only bind mounts of the pod's secrets into a
// container: every secret at its [[kbs.secrets]] path when no policy
// governs the container, else those its rule names, where it names them.
func (s *Service) secretMounts(grant *policy.Container) []specs.Mount {
	s.mu.Lock()
	defer s.mu.Unlock()
	named, all := grant.Secrets()
	out := make([]specs.Mount, 0, len(s.secrets))
	bind := func(m secretMount, dest string) {
		out = append(out, specs.Mount{
			Destination: dest, Type: "bind", Source: m.source,
			Options: []string{"rbind", "ro", "nosuid", "nodev", "noexec"},
		})
	}
	if all {
		for _, m := range s.secrets {
			bind(m, m.destination)
		}
		return out
	}
	for _, n := range named {
		for _, m := range s.secrets {
			if m.resource != n.Resource {
				continue
			}
			dest := n.Path
			if dest == "" {
				dest = m.destination
			}
			bind(m, dest)
		}
	}
	return out
}
