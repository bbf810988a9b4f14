package config

import (
	"strings"
	"testing"
)

func TestMigrationTable(t *testing.T) {
	c, err := Parse([]byte("[migration]\nshared_storage_root = \"/srv/shared\"\nplain_loopback = true\n"))
	if err != nil {
		t.Fatal(err)
	}
	if c.Migration != (Migration{SharedStorageRoot: "/srv/shared", PlainLoopback: true}) {
		t.Fatalf("[migration] = %+v", c.Migration)
	}
	if err := c.Migration.validate(); err != nil {
		t.Fatal(err)
	}
	if err := (Migration{SharedStorageRoot: "srv/shared"}).validate(); err == nil || !strings.Contains(err.Error(), "migration.shared_storage_root \"srv/shared\" must be an absolute path") {
		t.Fatalf("a relative root: %v", err)
	}
	if _, err := Parse([]byte("[migration]\nshared_storage = \"/x\"\n")); err == nil || !strings.Contains(err.Error(), "shared_storage") {
		t.Fatalf("an unknown key: %v", err)
	}
	if d := Default(); d.Migration != (Migration{}) {
		t.Fatalf("default [migration] = %+v, want no root and no plain stream", d.Migration)
	}
}
