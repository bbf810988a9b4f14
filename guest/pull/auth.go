package pull

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
)

// ParseCredentials reads registry credentials as the key broker releases
// them: a Docker config.json ({"auths": {"REGISTRY": {"auth": …}}}, the
// entry of registry), or one entry ({"username": …, "password": …},
// {"auth": "base64(user:password)"}, {"identitytoken": …}).
func ParseCredentials(b []byte, registry string) (*authn.AuthConfig, error) {
	var doc struct {
		Auths map[string]authn.AuthConfig `json:"auths"`
	}
	var c authn.AuthConfig
	// The errors say where, never what: a syntax error quotes the
	// character it met, and the error reaches the host.
	if err := json.Unmarshal(b, &doc); err != nil {
		return nil, fmt.Errorf("registry credentials: not JSON (a Docker config.json, or {\"username\": …, \"password\": …})%s", where(err))
	}
	if err := json.Unmarshal(b, &c); err != nil {
		return nil, fmt.Errorf("registry credentials: not a credentials object%s", where(err))
	}
	if doc.Auths != nil {
		var ok bool
		for k, v := range doc.Auths {
			host := strings.TrimSuffix(strings.TrimPrefix(strings.TrimPrefix(k, "https://"), "http://"), "/")
			if i := strings.IndexByte(host, '/'); i >= 0 {
				host = host[:i]
			}
			if host == registry || (registry == "index.docker.io" && (host == "docker.io" || host == "registry-1.docker.io")) {
				c, ok = v, true
				break
			}
		}
		if !ok {
			return nil, fmt.Errorf("registry credentials: the config.json has no entry for %s", registry)
		}
	}
	if c.Auth != "" && c.Username == "" {
		raw, err := base64.StdEncoding.DecodeString(c.Auth)
		if err != nil {
			return nil, fmt.Errorf("registry credentials: auth is not base64: %w", err)
		}
		user, pass, ok := strings.Cut(string(raw), ":")
		if !ok {
			return nil, errors.New("registry credentials: auth is not base64(user:password)")
		}
		c.Username, c.Password, c.Auth = user, pass, ""
	}
	if c.Username == "" && c.IdentityToken == "" && c.RegistryToken == "" {
		return nil, errors.New("registry credentials: no username, identitytoken or registrytoken")
	}
	return &c, nil
}

// where says at which byte a JSON error is, if it says so.
func where(err error) string {
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return fmt.Sprintf(" (at byte %d)", se.Offset)
	}
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		return fmt.Sprintf(" (%s is not a %s)", te.Field, te.Type)
	}
	return ""
}
