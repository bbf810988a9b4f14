package config

import (
	"strings"
	"testing"
)

func TestGuestPull(t *testing.T) {
	for _, v := range []string{"", GuestPullAuto, GuestPullAlways, GuestPullNever} {
		c := Default()
		c.Runtime.GuestPull = v
		if err := c.Validate(); err != nil && strings.Contains(err.Error(), "guest_pull") {
			t.Errorf("guest_pull %q: %v", v, err)
		}
	}
	c := Default()
	c.Runtime.GuestPull = "sometimes"
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), `runtime.guest_pull "sometimes" is not valid`) {
		t.Fatalf("guest_pull sometimes: %v", err)
	}
	if c, err := Parse([]byte("[runtime]\nguest_pull = \"never\"\n")); err != nil || c.Runtime.GuestPull != GuestPullNever {
		t.Fatalf("parse: %+v, %v", c, err)
	}
}
