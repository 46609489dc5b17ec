package healthcheck

import (
	"encoding/json"
	"net"
	"net/http"
	"strconv"
	"testing"

	"k8s.io/apimachinery/pkg/types"
)

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

func TestServiceHealthServer(t *testing.T) {
	web := types.NamespacedName{Namespace: "default", Name: "web"}
	local := map[types.NamespacedName]int{web: 2}
	s := NewServiceHealthServer("127.0.0.1", func(nn types.NamespacedName) int { return local[nn] })
	t.Cleanup(s.Close)
	port := freePort(t)
	if err := s.SyncServices(map[types.NamespacedName]int{web: port}); err != nil {
		t.Fatal(err)
	}
	get := func() (int, serviceHealthBody) {
		t.Helper()
		resp, err := http.Get("http://127.0.0.1:" + strconv.Itoa(port) + "/")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var b serviceHealthBody
		if err := json.NewDecoder(resp.Body).Decode(&b); err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, b
	}
	if code, b := get(); code != 200 || b.LocalEndpoints != 2 || b.Service.Name != "web" {
		t.Fatalf("with local endpoints: %d %+v", code, b)
	}
	local[web] = 0
	if code, b := get(); code != 503 || b.LocalEndpoints != 0 {
		t.Fatalf("without local endpoints: %d %+v", code, b)
	}
	if err := s.SyncServices(nil); err != nil {
		t.Fatal(err)
	}
	if c, err := net.Dial("tcp", "127.0.0.1:"+strconv.Itoa(port)); err == nil {
		c.Close()
		t.Fatal("health port still open after its Service went away")
	}
}
