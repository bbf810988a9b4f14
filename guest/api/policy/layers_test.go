package policy

import (
	"strings"
	"testing"
)

func TestValidateLayers(t *testing.T) {
	good := Layer{Digest: "sha256:" + strings.Repeat("ab", 32), Verity: strings.Repeat("cd", 32), Blocks: 7}
	if err := validateLayers("policy.containers.app", []Layer{good}); err != nil {
		t.Fatalf("a well-formed layer refused: %v", err)
	}
	bad := []Layer{
		{Digest: "sha512:" + strings.Repeat("ab", 32), Verity: good.Verity, Blocks: 1},
		{Digest: good.Digest, Verity: strings.Repeat("CD", 32), Blocks: 1},
		{Digest: good.Digest, Verity: good.Verity},
	}
	err := validateLayers("policy.containers.app", bad)
	if err == nil {
		t.Fatal("malformed layers accepted")
	}
	for _, want := range []string{"app.layers[0].digest", "app.layers[1].verity", "app.layers[2].blocks: required"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %q", err, want)
		}
	}
}
