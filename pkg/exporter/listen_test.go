package exporter

import (
	"net"

	"github.com/dpkit/dpkit/internal/unixsock"
)

func podresourcesListen(socket string) (net.Listener, error) { return unixsock.Listen(socket) }
