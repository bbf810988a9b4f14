package attest

import "encoding/hex"

func hexOf(n [64]byte) string { return hex.EncodeToString(n[:]) }
