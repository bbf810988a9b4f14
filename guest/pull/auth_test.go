package pull

import (
	"encoding/base64"
	"strings"
	"testing"
)

func TestParseCredentials(t *testing.T) {
	b64 := base64.StdEncoding.EncodeToString([]byte("u:p"))
	for name, doc := range map[string]string{
		"entry":       `{"username":"u","password":"p"}`,
		"auth":        `{"auth":"` + b64 + `"}`,
		"config.json": `{"auths":{"other:5000":{"auth":"eDp5"},"https://reg:5000/v2/":{"auth":"` + b64 + `"}}}`,
	} {
		c, err := ParseCredentials([]byte(doc), "reg:5000")
		if err != nil || c.Username != "u" || c.Password != "p" {
			t.Errorf("%s: %+v, %v", name, c, err)
		}
	}
	for name, doc := range map[string]string{
		"no entry": `{"auths":{"other:5000":{"auth":"` + b64 + `"}}}`,
		"empty":    `{}`,
		"not json": `u:p`,
	} {
		if _, err := ParseCredentials([]byte(doc), "reg:5000"); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// TestCredentialErrorsQuoteNothing: the error of credentials that are not
// JSON reaches the host (CreateContainer's); a JSON syntax error would
// quote the token's first character.
func TestCredentialErrorsQuoteNothing(t *testing.T) {
	for _, secret := range []string{"ghp_secret", `{"username": "u", "password": 7}`, `{"auths": "zz"}`} {
		_, err := ParseCredentials([]byte(secret), "registry.example")
		if err == nil {
			t.Fatalf("%q parsed", secret)
		}
		for _, leak := range []string{"'g'", "ghp", "zz", "7"} {
			if strings.Contains(err.Error(), leak) {
				t.Errorf("the error %q quotes %s of the credential", err, leak)
			}
		}
	}
}
