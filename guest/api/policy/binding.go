package policy

// BindsImage reports whether the rule binds the container's file system
// to the owner's image: it pins the image's layers (dm-verity roots the
// guest opens them with), or names a digest-pinned reference the guest
// pulls and verifies itself (pull.go).
func (c *Container) BindsImage() bool {
	return len(c.Layers) > 0 || c.Pull != ""
}
