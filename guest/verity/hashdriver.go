package verity

import (
	"bufio"
	"bytes"
	"strconv"
	"strings"
)

// ProcCrypto lists the kernel's crypto algorithm implementations.
const ProcCrypto = "/proc/crypto"

// HashDriver is an implementation of a hash algorithm in the kernel's
// crypto API, as /proc/crypto lists it.
type HashDriver struct {
	// Driver is the implementation's name: "sha256-generic" (portable C),
	// "sha256-ssse3", "sha256-avx", "sha256-avx2", "sha256-ni" (the CPU's
	// SHA instructions).
	Driver string
	// Module is the module that registered it, "kernel" when built in.
	Module   string
	Priority int
}

// SelectedHash returns the implementation of alg that the crypto API hands
// a new user, such as a dm-verity table being loaded: among the entries of
// procCrypto (the text of /proc/crypto) named alg that are hashes, not
// internal and have not failed their self-test, the one of the highest
// priority. ok is false when procCrypto has none.
//
// Which one dm-verity gets decides what reading the verified root and the
// layer disks costs: the portable implementation hashes several times
// slower than the CPU's SHA or AVX2 instructions, whose implementations
// Debian's kernel builds as a module (sha256_ssse3) that nothing loads
// unless the first stage does.
func SelectedHash(procCrypto []byte, alg string) (best HashDriver, ok bool) {
	for _, e := range cryptoEntries(procCrypto) {
		if e["name"] != alg || e["internal"] == "yes" || e["selftest"] == "unknown" || (e["selftest"] != "" && e["selftest"] != "passed") {
			continue
		}
		if t := e["type"]; t != "shash" && t != "ahash" {
			continue
		}
		prio, err := strconv.Atoi(e["priority"])
		if err != nil {
			continue
		}
		if !ok || prio > best.Priority {
			best, ok = HashDriver{Driver: e["driver"], Module: e["module"], Priority: prio}, true
		}
	}
	return best, ok
}

// cryptoEntries splits /proc/crypto into its entries ("key : value" lines,
// separated by blank lines).
func cryptoEntries(text []byte) []map[string]string {
	var (
		entries []map[string]string
		cur     map[string]string
	)
	sc := bufio.NewScanner(bytes.NewReader(text))
	for sc.Scan() {
		k, v, found := strings.Cut(sc.Text(), ":")
		if !found {
			cur = nil // a blank line ends the entry
			continue
		}
		if cur == nil {
			cur = map[string]string{}
			entries = append(entries, cur)
		}
		cur[strings.TrimSpace(k)] = strings.TrimSpace(v)
	}
	return entries
}
