// The etcd server, built from the go.etcd.io/etcd/server/v3 module at the version go.mod pins.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
