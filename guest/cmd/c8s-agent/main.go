// Command c8s-agent is the c8s guest agent, /init of the pod VM.
package main

import "github.com/c8s-dev/c8s/guest/boot"

func main() {
	boot.Main()
}
