// Command etcd runs a single-member etcd for a loopback control plane, built from etcd's embed
// package at the version this module pins. It takes only what the control plane needs.
package main

import (
	"flag"
	"log"
	"net/url"
	"os"
	"os/signal"
	"syscall"

	"go.etcd.io/etcd/server/v3/embed"
)

func main() {
	dataDir := flag.String("data-dir", "", "directory for the member's data (required)")
	clientURL := flag.String("listen-client-url", "http://127.0.0.1:2379", "client URL, loopback")
	peerURL := flag.String("listen-peer-url", "http://127.0.0.1:2380", "peer URL, loopback")
	quotaBytes := flag.Int64("quota-backend-bytes", 2<<30, "backend size quota, bytes")
	flag.Parse()
	if *dataDir == "" {
		log.Fatal("--data-dir is required")
	}

	cfg := embed.NewConfig()
	cfg.Name = "loopback"
	cfg.Dir = *dataDir
	cfg.LogLevel = "warn"
	cfg.QuotaBackendBytes = *quotaBytes
	// The control plane is disposable: an fsync per write would make Node patch storms
	// measure the disk, not the API server.
	cfg.UnsafeNoFsync = true
	client := mustURL(*clientURL)
	peer := mustURL(*peerURL)
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{client}, []url.URL{client}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{peer}, []url.URL{peer}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)

	server, err := embed.StartEtcd(cfg)
	if err != nil {
		log.Fatalf("etcd: %v", err)
	}
	defer server.Close()
	select {
	case <-server.Server.ReadyNotify():
		log.Printf("etcd ready on %s", client.String())
	case err := <-server.Err():
		log.Fatalf("etcd: %v", err)
	}

	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	select {
	case sig := <-stop:
		log.Printf("etcd: %s, stopping", sig)
	case err := <-server.Err():
		log.Fatalf("etcd: %v", err)
	}
}

func mustURL(raw string) url.URL {
	parsed, err := url.Parse(raw)
	if err != nil {
		log.Fatalf("bad URL %q: %v", raw, err)
	}
	return *parsed
}
