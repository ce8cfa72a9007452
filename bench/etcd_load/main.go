// Command etcd_load: the closed-loop put load of etcd's own tools/benchmark ("benchmark put"), which Debian
// does not ship, written over the same client library (go.etcd.io/etcd/clientv3, from golang-etcd-server-dev):
// N clients over C connections, each putting a value of S bytes and waiting for the answer, again and again,
// for D seconds after a warmup. Prints one line: "puts N seconds S rate R p50 A p99 B" (latencies in ms).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/clientv3"
)

func main() {
	endpoints := flag.String("endpoints", "127.0.0.1:2379", "comma-separated client URLs")
	clients := flag.Int("clients", 100, "concurrent writers")
	conns := flag.Int("conns", 1, "gRPC connections shared by the writers")
	valSize := flag.Int("val-size", 512, "value bytes")
	warmup := flag.Duration("warmup", 2*time.Second, "warmup before the measured window")
	duration := flag.Duration("duration", 10*time.Second, "measured window")
	flag.Parse()

	cs := make([]*clientv3.Client, *conns)
	for i := range cs {
		c, err := clientv3.New(clientv3.Config{Endpoints: strings.Split(*endpoints, ","), DialTimeout: 5 * time.Second})
		if err != nil {
			fmt.Fprintln(os.Stderr, "connect:", err)
			os.Exit(1)
		}
		defer c.Close()
		cs[i] = c
	}
	value := strings.Repeat("x", *valSize)
	begin := time.Now().Add(*warmup)
	end := begin.Add(*duration)
	var mu sync.Mutex
	var latencies []float64
	errors := 0
	var wg sync.WaitGroup
	for w := 0; w < *clients; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			c := cs[w%len(cs)]
			mine := []float64{}
			failed := 0
			for n := 0; ; n++ {
				start := time.Now()
				if !start.Before(end) {
					break
				}
				_, err := c.Put(context.Background(), fmt.Sprintf("bench/%d/%d", w, n%1000), value)
				done := time.Now()
				if err != nil {
					failed++
					continue
				}
				if !start.Before(begin) && done.Before(end) {
					mine = append(mine, float64(done.Sub(start))/1e6)
				}
			}
			mu.Lock()
			latencies = append(latencies, mine...)
			errors += failed
			mu.Unlock()
		}(w)
	}
	wg.Wait()
	sort.Float64s(latencies)
	pick := func(q float64) float64 {
		if len(latencies) == 0 {
			return 0
		}
		return latencies[int(q*float64(len(latencies)-1))]
	}
	fmt.Printf("puts %d seconds %.3f rate %.1f p50 %.3f p99 %.3f errors %d\n", len(latencies), duration.Seconds(),
		float64(len(latencies))/duration.Seconds(), pick(0.5), pick(0.99), errors)
}
