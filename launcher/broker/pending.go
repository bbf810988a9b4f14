package broker

import (
	"net"
	"net/http"
	"net/netip"
	"time"
)

// challenges is a table of what the broker hands out before anyone has
// proved anything (the key broker's sessions, the mesh CA's nonces),
// bounded so that whoever floods it fills only its own share. Each entry
// belongs to a source (the client's address): a source holds at most
// perSource unproven entries, and a full table makes room by dropping the
// oldest unproven entry of the source that holds the most. One node, or
// one client of the network, can thus not keep the pods of other nodes
// from attesting; it only drops its own challenges. Proven entries (an
// attested session) stay until they expire, but a source holds at most
// perSource of them too (a host can have its genuine pods attest without
// end): proving one more drops its oldest. A table full of proven
// entries drops the oldest of the source holding the most, if it holds
// more than one; else it refuses. The caller holds its own lock around
// every call.
type challenges[V any] struct {
	max, perSource int
	entries        map[string]*challenge[V]
}

type challenge[V any] struct {
	v       V
	source  string
	added   time.Time
	expires time.Time
	proven  bool
}

func newChallenges[V any](max, perSource int) *challenges[V] {
	return &challenges[V]{max: max, perSource: perSource, entries: map[string]*challenge[V]{}}
}

// source is the client address of r, the unit of a challenge table's
// fairness. Headers are not read: anyone sets them. Clients behind one
// NAT or proxy share its share; a host with many addresses (an IPv6 /64)
// has as many shares, which a full table then takes from oldest first.
// (Grouping a /64 would put an IPv6 cluster's nodes, often on one /64,
// into one share that any of them could empty.)
func source(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	if a, err := netip.ParseAddr(host); err == nil {
		return a.Unmap().WithZone("").String()
	}
	return host
}

// add enters v under id for src until expires, making room as the table
// says; false when the table is full of proven entries.
func (t *challenges[V]) add(now time.Time, id, src string, expires time.Time, v V) bool {
	t.expire(now)
	if t.unproven(src) >= t.perSource {
		t.dropOldest(src)
	}
	if len(t.entries) >= t.max {
		if !t.dropFromHeaviest(false, 1) && !t.dropFromHeaviest(true, 2) {
			return false
		}
	}
	t.entries[id] = &challenge[V]{v: v, source: src, added: now, expires: expires}
	return true
}

// get returns the live entry id, dropping it if it expired.
func (t *challenges[V]) get(now time.Time, id string) (V, bool) {
	e, ok := t.entries[id]
	if !ok || now.After(e.expires) {
		delete(t.entries, id)
		var zero V
		return zero, false
	}
	return e.v, true
}

// take returns the live entry id and removes it.
func (t *challenges[V]) take(now time.Time, id string) (V, bool) {
	v, ok := t.get(now, id)
	delete(t.entries, id)
	return v, ok
}

// prove marks entry id proven: no flood of challenges drops it. Past
// perSource proven entries of its source, the source's oldest goes.
func (t *challenges[V]) prove(id string) {
	e, ok := t.entries[id]
	if !ok {
		return
	}
	e.proven = true
	n := 0
	for _, o := range t.entries {
		if o.proven && o.source == e.source {
			n++
		}
	}
	if n > t.perSource {
		t.dropOldestOf(e.source, true, id)
	}
}

// dropFromHeaviest drops, of the sources holding the most entries proven
// or not as given (at least atLeast), the oldest such entry: no source is
// dropped first for its name. False when no source holds atLeast.
func (t *challenges[V]) dropFromHeaviest(proven bool, atLeast int) bool {
	counts := map[string]int{}
	most := 0
	for _, e := range t.entries {
		if e.proven == proven {
			counts[e.source]++
			most = max(most, counts[e.source])
		}
	}
	if most < atLeast {
		return false
	}
	oldest := ""
	var at time.Time
	for id, e := range t.entries {
		if e.proven == proven && counts[e.source] == most && (oldest == "" || e.added.Before(at)) {
			oldest, at = id, e.added
		}
	}
	delete(t.entries, oldest)
	return true
}

func (t *challenges[V]) expire(now time.Time) {
	for id, e := range t.entries {
		if now.After(e.expires) {
			delete(t.entries, id)
		}
	}
}

func (t *challenges[V]) unproven(src string) int {
	n := 0
	for _, e := range t.entries {
		if !e.proven && e.source == src {
			n++
		}
	}
	return n
}

func (t *challenges[V]) dropOldest(src string) { t.dropOldestOf(src, false, "") }

// dropOldestOf drops src's oldest entry, proven or not as given, other
// than keep.
func (t *challenges[V]) dropOldestOf(src string, proven bool, keep string) {
	oldest := ""
	var at time.Time
	for id, e := range t.entries {
		if id != keep && e.proven == proven && e.source == src && (oldest == "" || e.added.Before(at)) {
			oldest, at = id, e.added
		}
	}
	delete(t.entries, oldest)
}
