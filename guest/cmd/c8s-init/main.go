// Command c8s-init is the first-stage init of a sealed c8s guest image: it
// maps the dm-verity root named on the measured kernel command line and
// switches into it (see guest/stage1).
package main

import "github.com/c8s-dev/c8s/guest/stage1"

func main() { stage1.Main() }
