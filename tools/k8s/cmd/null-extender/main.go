// Command null-extender is a kube-scheduler extender that decides nothing: filter passes every
// node it is sent, prioritize gives each a score of 0. The real-scheduler benchmark runs it to
// measure what the extender mechanism itself costs kube-scheduler (two HTTP calls per pod, the
// scheduler's JSON encoding of the request and decoding of the reply) apart from any scorer.
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"io"
	"log"
	"net"
	"net/http"
)

// args is ExtenderArgs as kube-scheduler sends it; Node objects stay raw, to be echoed.
type args struct {
	Nodes *struct {
		Items []json.RawMessage `json:"items"`
	}
	NodeNames *[]string
}

func main() {
	address := flag.String("listen", "127.0.0.1:0", "address to serve on")
	flag.Parse()

	http.HandleFunc("/filter", func(w http.ResponseWriter, r *http.Request) {
		request, ok := read(w, r)
		if !ok {
			return
		}
		var reply bytes.Buffer
		if request.Nodes != nil {
			// Full-node mode: the scheduler reads only Nodes.items of the reply.
			reply.WriteString(`{"Nodes":{"items":[`)
			for i, item := range request.Nodes.Items {
				if i > 0 {
					reply.WriteByte(',')
				}
				reply.Write(item)
			}
			reply.WriteString(`]},"NodeNames":null,"FailedNodes":{},"FailedAndUnresolvableNodes":{},"Error":""}`)
		} else {
			names, _ := json.Marshal(request.NodeNames)
			reply.WriteString(`{"Nodes":null,"NodeNames":`)
			reply.Write(names)
			reply.WriteString(`,"FailedNodes":{},"FailedAndUnresolvableNodes":{},"Error":""}`)
		}
		write(w, reply.Bytes())
	})
	http.HandleFunc("/prioritize", func(w http.ResponseWriter, r *http.Request) {
		request, ok := read(w, r)
		if !ok {
			return
		}
		type hostPriority struct {
			Host  string
			Score int64
		}
		scores := []hostPriority{}
		if request.Nodes != nil {
			for _, item := range request.Nodes.Items {
				var node struct {
					Metadata struct {
						Name string `json:"name"`
					} `json:"metadata"`
				}
				_ = json.Unmarshal(item, &node)
				scores = append(scores, hostPriority{node.Metadata.Name, 0})
			}
		} else if request.NodeNames != nil {
			for _, name := range *request.NodeNames {
				scores = append(scores, hostPriority{name, 0})
			}
		}
		body, _ := json.Marshal(scores)
		write(w, body)
	})

	listener, err := net.Listen("tcp", *address)
	if err != nil {
		log.Fatalf("null-extender: %v", err)
	}
	// The benchmark reads the address it got from the first line.
	log.SetFlags(0)
	log.Printf("listening on %s", listener.Addr())
	log.Fatal(http.Serve(listener, nil))
}

func read(w http.ResponseWriter, r *http.Request) (args, bool) {
	var request args
	body, err := io.ReadAll(r.Body)
	if err == nil {
		err = json.Unmarshal(body, &request)
	}
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return request, false
	}
	return request, true
}

func write(w http.ResponseWriter, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(body)
}
