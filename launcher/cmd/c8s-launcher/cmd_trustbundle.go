package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/c8s-dev/c8s/launcher/node/reattest"
)

func init() {
	register("trust-bundle", "sign or verify a pod owner's trust bundle (reference values, minimum TCB, revocations) for the node agent's re-attestation", runTrustBundle)
}

const trustBundleUsage = `usage:
  c8s-launcher trust-bundle sign --key OWNER_KEY.pem BUNDLE.json > BUNDLE.jws
  c8s-launcher trust-bundle verify --key OWNER_PUB.pem BUNDLE.jws
OWNER_KEY.pem is a PKCS #8 Ed25519 or ECDSA P-256 private key, for example
  openssl genpkey -algorithm ed25519 -out owner.pem && openssl pkey -in owner.pem -pubout -out owner.pub`

func runTrustBundle(_ context.Context, args []string, stdout io.Writer) error {
	if len(args) == 0 {
		return errors.New(trustBundleUsage)
	}
	fs := newFlags("trust-bundle " + args[0])
	key := fs.String("key", "", "the owner's signing key (sign) or public key(s) (verify), PEM")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	if fs.NArg() != 1 || *key == "" {
		return errors.New(trustBundleUsage)
	}
	keyPEM, err := os.ReadFile(*key)
	if err != nil {
		return err
	}
	data, err := os.ReadFile(fs.Arg(0))
	if err != nil {
		return err
	}
	switch args[0] {
	case "sign":
		signer, err := reattest.ParsePrivateKey(keyPEM)
		if err != nil {
			return err
		}
		jws, err := reattest.Sign(data, signer)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintln(stdout, jws)
		return err
	case "verify":
		keys, err := reattest.ParsePublicKeys(keyPEM)
		if err != nil {
			return err
		}
		b, err := reattest.Verify(data, keys)
		if err != nil {
			return err
		}
		out, err := json.MarshalIndent(b.Bundle, "", "  ")
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(stdout, "%s\n", out)
		return err
	}
	return errors.New(trustBundleUsage)
}
