// Package faultapi serves the live fault API: Toxiproxy's REST API over a
// faults.Table, so Toxiproxy's own Go client and CLI work unchanged.
//
// Each service port is a proxy named <namespace>.<service>.<port name, or
// number when unnamed>. Proxies are the cluster's Services, so the API
// lists them, shows them, turns them down and up and sets toxics on them,
// but refuses to create or delete them (409; /populate accepts the
// proxies that exist). Toxics declared in a
// Service's kube-userspace-proxy/faults annotation are listed (with
// "origin": "annotation") and cannot be changed here (409); toxics set
// through the API carry "origin": "api" and are what POST /reset removes.
//
// Routes, status codes and error bodies ({"error": "...", "status": N})
// follow Toxiproxy's api.go:
//
//	GET    /proxies                         200 {name: proxy}
//	POST   /proxies                         409 (proxies are Services)
//	POST   /populate                        201 {proxies} | 400 | 409 (only existing proxies)
//	GET    /proxies/{proxy}                 200 proxy | 404
//	POST   /proxies/{proxy} (or PATCH)      200 proxy | 400 | 404 | 409
//	DELETE /proxies/{proxy}                 409 (proxies are Services)
//	GET    /proxies/{proxy}/toxics          200 [toxic] | 404
//	POST   /proxies/{proxy}/toxics          200 toxic | 400 | 404 | 409
//	GET    /proxies/{proxy}/toxics/{toxic}  200 toxic | 404
//	POST   /proxies/{proxy}/toxics/{toxic}  200 toxic | 400 | 404 | 409 (or PATCH)
//	DELETE /proxies/{proxy}/toxics/{toxic}  204 | 404 | 409
//	POST   /reset                           204
//	GET    /version                         200 {"version": "..."}
//
// Like Toxiproxy, it refuses any request whose User-Agent starts with
// "Mozilla/" (403): every browser sends one, and the API has no
// authentication, so a web page must not be able to drive it (CSRF).
package faultapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"reflect"
	"slices"
	"strings"

	"k8s.io/klog/v2"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/faults"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/clip"
)

// maxBody caps a request body; a toxic or a proxy is a few hundred bytes.
const maxBody = 1 << 20

// namingHint tells users where proxies come from; it ends every refusal
// to create or delete one and every "proxy not found".
const namingHint = "proxies are the cluster's Service ports, named " +
	"<namespace>.<service>.<port name, or number when unnamed> (e.g. default.web.http); " +
	"GET /proxies lists them"

// proxyJSON is a proxy in Toxiproxy's shape.
type proxyJSON struct {
	Name     string      `json:"name"`
	Listen   string      `json:"listen"`
	Upstream string      `json:"upstream"`
	Enabled  bool        `json:"enabled"`
	Toxics   []toxicJSON `json:"toxics"`
}

// toxicJSON is a toxic in Toxiproxy's shape plus our fields. Toxiproxy's
// client decodes with encoding/json's defaults, which ignore unknown
// fields, so the additions cost it nothing.
type toxicJSON struct {
	Name       string             `json:"name"`
	Type       string             `json:"type"`
	Stream     string             `json:"stream"`
	Toxicity   float32            `json:"toxicity"`
	Attributes map[string]float64 `json:"attributes"`
	Port       string             `json:"port,omitempty"`
	Clients    []string           `json:"clients,omitempty"`
	Seed       *int64             `json:"seed,omitempty"`
	Origin     string             `json:"origin"`
}

// apiError is Toxiproxy's error body.
type apiError struct {
	Message string `json:"error"`
	Status  int    `json:"status"`
}

type server struct {
	table   *faults.Table
	version string
}

// New returns the API over table; version is what GET /version reports.
func New(table *faults.Table, version string) http.Handler {
	s := &server{table: table, version: version}
	mux := http.NewServeMux()
	// Methods are dispatched here rather than in the patterns, so a wrong
	// method gets a JSON 405 instead of ServeMux's plain-text one.
	mux.HandleFunc("/reset", s.route(map[string]http.HandlerFunc{"POST": s.reset}))
	mux.HandleFunc("/version", s.route(map[string]http.HandlerFunc{"GET": s.showVersion}))
	mux.HandleFunc("/populate", s.route(map[string]http.HandlerFunc{"POST": s.populate}))
	mux.HandleFunc("/proxies", s.route(map[string]http.HandlerFunc{
		"GET":  s.proxyIndex,
		"POST": s.proxyCreate,
	}))
	mux.HandleFunc("/proxies/{proxy}", s.route(map[string]http.HandlerFunc{
		"GET":    s.proxyShow,
		"POST":   s.proxyUpdate,
		"PATCH":  s.proxyUpdate,
		"DELETE": s.proxyDelete,
	}))
	mux.HandleFunc("/proxies/{proxy}/toxics", s.route(map[string]http.HandlerFunc{
		"GET":  s.toxicIndex,
		"POST": s.toxicCreate,
	}))
	mux.HandleFunc("/proxies/{proxy}/toxics/{toxic}", s.route(map[string]http.HandlerFunc{
		"GET":    s.toxicShow,
		"POST":   s.toxicUpdate,
		"PATCH":  s.toxicUpdate,
		"DELETE": s.toxicDelete,
	}))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, fmt.Sprintf("no such route: %s %s", r.Method, r.URL.Path))
	})
	return stopBrowsers(mux)
}

// stopBrowsers is Toxiproxy's CSRF guard: browsers all send a User-Agent
// beginning with "Mozilla/", its client and CLI never do.
func stopBrowsers(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.UserAgent(), "Mozilla/") {
			writeError(w, http.StatusForbidden, "User agent not allowed: the fault API refuses requests "+
				"from web browsers (User-Agent \"Mozilla/...\"), so that a web page cannot drive it (CSRF); "+
				"use Toxiproxy's client or CLI, or curl")
			return
		}
		next.ServeHTTP(w, r)
	})
}

// route dispatches on the method; HEAD is served as GET.
func (s *server) route(methods map[string]http.HandlerFunc) http.HandlerFunc {
	allowed := make([]string, 0, len(methods))
	for _, m := range []string{"GET", "POST", "PATCH", "DELETE"} {
		if methods[m] != nil {
			allowed = append(allowed, m)
		}
	}
	allow := strings.Join(allowed, ", ")
	return func(w http.ResponseWriter, r *http.Request) {
		method := r.Method
		if method == http.MethodHead {
			method = http.MethodGet
		}
		if h := methods[method]; h != nil {
			h(w, r)
			return
		}
		w.Header().Set("Allow", allow)
		writeError(w, http.StatusMethodNotAllowed,
			fmt.Sprintf("method %s not allowed on %s (allowed: %s)", r.Method, r.URL.Path, allow))
	}
}

func (s *server) proxyIndex(w http.ResponseWriter, r *http.Request) {
	proxies := s.table.Proxies()
	out := make(map[string]proxyJSON, len(proxies))
	for _, p := range proxies {
		out[p.Name] = proxyOut(p)
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *server) proxyCreate(w http.ResponseWriter, r *http.Request) {
	writeError(w, http.StatusConflict, "proxies cannot be created through the fault API: "+namingHint+
		"; create a Service to get one")
}

// populate takes Toxiproxy's body, a list of proxies, as a declaration of
// proxies that must exist: each must name a service port's proxy (none is
// created), a listen address given must be its own (none is moved),
// upstream is not compared (proxyUpdate says why), and enabled is left as
// it is, as Toxiproxy leaves an existing proxy whose addresses match: its
// Go client sends "enabled":false unless the caller sets it, so applying
// it turned the Service down. Test suites call it in their set-up with the
// proxies they use; refusing every call failed them even when those
// proxies existed.
// Nothing is applied unless every entry is acceptable.
func (s *server) populate(w http.ResponseWriter, r *http.Request) {
	body, ok := readBody(w, r)
	if !ok {
		return
	}
	var in []struct {
		Name     string `json:"name"`
		Listen   string `json:"listen"`
		Upstream string `json:"upstream"`
	}
	if err := json.Unmarshal(body, &in); err != nil {
		writePopulated(w, http.StatusBadRequest, "bad request body: "+bodyError(r, body, err, "a JSON list of proxies"), nil)
		return
	}
	infos := make([]faults.ProxyInfo, len(in))
	for i, p := range in {
		// Toxiproxy's checks and words (proxy_collection.go): a set-up
		// written against it must fail here as it fails there.
		if p.Name == "" {
			writePopulated(w, http.StatusBadRequest, fmt.Sprintf("missing required field: name at proxy %d", i+1), nil)
			return
		}
		if p.Upstream == "" {
			writePopulated(w, http.StatusBadRequest, fmt.Sprintf("missing required field: upstream at proxy %d", i+1), nil)
			return
		}
		info, err := s.table.Proxy(p.Name)
		if err != nil {
			writePopulated(w, http.StatusConflict, fmt.Sprintf("proxy %s does not exist and cannot be created "+
				"through the fault API: %s; create a Service to get it", p.Name, namingHint), nil)
			return
		}
		if p.Listen != "" && !info.ListensOn(p.Listen) {
			writePopulated(w, http.StatusConflict, fmt.Sprintf("proxy %s listens on %s, not %s: it is a Service "+
				"port's address and cannot be moved", p.Name, info.Listen, p.Listen), nil)
			return
		}
		infos[i] = info
	}
	out := make([]proxyJSON, len(in))
	for i := range in {
		out[i] = proxyOut(infos[i])
	}
	writePopulated(w, http.StatusCreated, "", out)
}

// writePopulated is Toxiproxy's /populate answer: its error fields, if
// any, beside the proxies populated.
func writePopulated(w http.ResponseWriter, status int, msg string, proxies []proxyJSON) {
	if proxies == nil {
		proxies = []proxyJSON{}
	}
	body := struct {
		*apiError
		Proxies []proxyJSON `json:"proxies"`
	}{Proxies: proxies}
	if msg != "" {
		body.apiError = &apiError{Message: msg, Status: status}
	}
	writeJSON(w, status, body)
}

func (s *server) proxyShow(w http.ResponseWriter, r *http.Request) {
	info, ok := s.proxy(w, r)
	if !ok {
		return
	}
	writeJSON(w, http.StatusOK, proxyOut(info))
}

// proxyUpdate takes Toxiproxy's body: the client's Save, Enable and
// Disable send the whole proxy (name, listen, upstream, enabled, toxics).
// Only enabled may change. Fields left out keep their value, as in
// Toxiproxy; "toxics" is ignored, as in Toxiproxy.
func (s *server) proxyUpdate(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("proxy")
	info, ok := s.proxy(w, r)
	if !ok {
		return
	}
	body, ok := readBody(w, r)
	if !ok {
		return
	}
	var in struct {
		Name     *string `json:"name"`
		Listen   *string `json:"listen"`
		Upstream *string `json:"upstream"`
		Enabled  *bool   `json:"enabled"`
	}
	if err := json.Unmarshal(body, &in); err != nil {
		writeError(w, http.StatusBadRequest, "bad request body: "+bodyError(r, body, err, `a JSON object (a proxy: {"enabled": ...})`))
		return
	}
	if in.Enabled == nil {
		if field, ok := unknownProxyField(body); ok {
			// Without enabled the body sets nothing, so a field a proxy does
			// not have is a misspelt enabled ("enabeld"), which Toxiproxy
			// ignores, answering 200 with the proxy as it was: the caller
			// believed the Service down. Beside enabled, unknown fields pass
			// as in Toxiproxy: other clients' proxies carry their own
			// (noxious-client's rand_seed).
			writeError(w, http.StatusBadRequest, fmt.Sprintf("unknown field %s: a proxy has name, listen, upstream, "+
				"enabled and toxics, and only enabled can be set through the fault API", clip.Quote(field)))
			return
		}
	}
	if in.Name != nil && *in.Name != "" && *in.Name != info.Name {
		writeError(w, http.StatusConflict, fmt.Sprintf(
			"name cannot be changed (%q to %s): %s", info.Name, clip.Quote(*in.Name), namingHint))
		return
	}
	if in.Listen != nil && *in.Listen != "" && !info.ListensOn(*in.Listen) {
		writeError(w, http.StatusConflict, fmt.Sprintf(
			"listen cannot be changed (%q to %s): it is the address of Service port %s; "+
				"only \"enabled\" can be set through the fault API", info.Listen, clip.Quote(*in.Listen), info.Name))
		return
	}
	// upstream is not compared: it is the Service's endpoints, which change
	// on their own (a pod restarts), so a client that fetched the proxy
	// before then sends a stale copy with Disable or Enable, and refusing it
	// would leave the proxy stuck down. The reply shows the real upstream.
	if in.Enabled != nil && *in.Enabled != info.Enabled {
		var err error
		info, err = s.table.SetEnabled(name, *in.Enabled)
		if err != nil {
			s.fail(w, r, err, false)
			return
		}
	}
	writeJSON(w, http.StatusOK, proxyOut(info))
}

// unknownProxyField returns a field of a proxy body (a JSON object) that
// Toxiproxy's proxy does not have, in any case as encoding/json matches
// them; the first in sorted order, so the answer does not vary.
func unknownProxyField(body []byte) (string, bool) {
	var fields map[string]json.RawMessage
	if json.Unmarshal(body, &fields) != nil {
		return "", false
	}
	for _, k := range slices.Sorted(maps.Keys(fields)) {
		known := false
		for _, f := range []string{"name", "listen", "upstream", "enabled", "toxics"} {
			known = known || strings.EqualFold(k, f)
		}
		if !known {
			return k, true
		}
	}
	return "", false
}

func (s *server) proxyDelete(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("proxy")
	if _, ok := s.proxy(w, r); !ok {
		return
	}
	writeError(w, http.StatusConflict, fmt.Sprintf(
		"proxy %s cannot be deleted through the fault API: %s; delete the Service, "+
			"or turn the proxy down with POST /proxies/%s {\"enabled\": false}", name, namingHint, name))
}

func (s *server) toxicIndex(w http.ResponseWriter, r *http.Request) {
	info, ok := s.proxy(w, r)
	if !ok {
		return
	}
	writeJSON(w, http.StatusOK, proxyOut(info).Toxics)
}

// toxicBody checks the request's proxy and returns its toxic body without
// "origin" (a toxic the API showed can be posted back as it is); when it
// returns false it has answered.
func (s *server) toxicBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	if err := s.table.Exists(r.PathValue("proxy")); err != nil {
		s.fail(w, r, err, false)
		return nil, false
	}
	body, ok := readBody(w, r)
	if !ok {
		return nil, false
	}
	body, err := withoutOrigin(r, body)
	if err != nil {
		writeError(w, http.StatusBadRequest, "bad request body: "+err.Error())
		return nil, false
	}
	return body, true
}

func (s *server) toxicCreate(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("proxy")
	body, ok := s.toxicBody(w, r)
	if !ok {
		return
	}
	var tx faults.Toxic
	if err := json.Unmarshal(body, &tx); err != nil {
		writeError(w, http.StatusBadRequest, "bad request body: "+err.Error())
		return
	}
	added, err := s.table.AddToxic(name, tx)
	if err != nil {
		s.fail(w, r, err, true)
		return
	}
	writeJSON(w, http.StatusOK, toxicOut(added, faults.OriginAPI))
}

func (s *server) toxicShow(w http.ResponseWriter, r *http.Request) {
	tx, err := s.table.Toxic(r.PathValue("proxy"), r.PathValue("toxic"))
	if err != nil {
		s.fail(w, r, err, false)
		return
	}
	writeJSON(w, http.StatusOK, toxicOut(tx.Toxic, tx.Origin))
}

// toxicUpdate takes Toxiproxy's update body (toxicity and attributes;
// attributes left out keep their value). Toxiproxy ignores any other
// field; here stream and clients may change too, and name and type are
// ignored as there. A port cannot be set: the proxy is one service port.
func (s *server) toxicUpdate(w http.ResponseWriter, r *http.Request) {
	proxy, toxic := r.PathValue("proxy"), r.PathValue("toxic")
	body, ok := s.toxicBody(w, r)
	if !ok {
		return
	}
	// A port in the body is refused by the table, as for AddToxic.
	updated, err := s.table.UpdateToxic(proxy, toxic, body)
	if err != nil {
		s.fail(w, r, err, true)
		return
	}
	writeJSON(w, http.StatusOK, toxicOut(updated, faults.OriginAPI))
}

func (s *server) toxicDelete(w http.ResponseWriter, r *http.Request) {
	if err := s.table.RemoveToxic(r.PathValue("proxy"), r.PathValue("toxic")); err != nil {
		s.fail(w, r, err, false)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *server) reset(w http.ResponseWriter, r *http.Request) {
	if err := s.table.Reset(); err != nil {
		s.fail(w, r, err, false)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *server) showVersion(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"version": s.version})
}

// fail maps the table's errors to Toxiproxy's codes and messages, with
// what to do next where that helps.
// fromBody says err came from handling a request body, so errors the
// table does not name are the body's fault (400), not the server's (500).
func (s *server) fail(w http.ResponseWriter, r *http.Request, err error, fromBody bool) {
	var fe *faults.FieldError
	switch {
	case errors.Is(err, faults.ErrProxyNotFound):
		writeError(w, http.StatusNotFound, err.Error()+" ("+namingHint+")")
	case errors.Is(err, faults.ErrToxicNotFound):
		writeError(w, http.StatusNotFound, err.Error())
	case errors.Is(err, faults.ErrToxicExists):
		writeError(w, http.StatusConflict, err.Error())
	case errors.Is(err, faults.ErrNotServing):
		// The port is enabled (its socket retries), but nothing serves
		// it: not a success, and not the request's fault.
		writeError(w, http.StatusServiceUnavailable, err.Error()+
			"; the proxy is enabled and its socket keeps trying to listen (service_ports_unserved counts it until then)")
	case errors.Is(err, faults.ErrDeclared):
		writeError(w, http.StatusConflict, fmt.Sprintf(
			"toxic %s is declared in the kube-userspace-proxy/faults annotation of its Service and "+
				"cannot be changed or removed through the fault API; edit the annotation instead",
			r.PathValue("toxic")))
	case errors.As(err, &fe):
		switch fe.Field {
		case "type":
			writeError(w, http.StatusBadRequest, "invalid toxic type: "+fe.Reason)
		case "stream":
			writeError(w, http.StatusBadRequest, "stream was invalid, can be either upstream or downstream: "+fe.Reason)
		default:
			writeError(w, http.StatusBadRequest, "invalid toxic: "+fe.Error())
		}
	case fromBody:
		// The table's remaining errors on a toxic body are decoding errors
		// (a wrong type, an unknown field): the body is at fault.
		writeError(w, http.StatusBadRequest, "bad request body: "+err.Error())
	default:
		klog.ErrorS(err, "Fault API request failed", "method", r.Method, "path", r.URL.Path)
		writeError(w, http.StatusInternalServerError, err.Error())
	}
}

// proxyOut lists a proxy's toxics upstream first, then downstream, each in
// the table's order, as Toxiproxy lists its two chains.
func proxyOut(p faults.ProxyInfo) proxyJSON {
	out := proxyJSON{Name: p.Name, Listen: p.Listen, Upstream: p.Upstream, Enabled: p.Enabled,
		Toxics: make([]toxicJSON, 0, len(p.Toxics))}
	for _, upstream := range []bool{true, false} {
		for _, t := range p.Toxics {
			if (t.Stream == faults.Upstream) == upstream {
				out.Toxics = append(out.Toxics, toxicOut(t.Toxic, t.Origin))
			}
		}
	}
	return out
}

func toxicOut(t faults.Toxic, origin string) toxicJSON {
	attrs := t.Attributes
	if attrs == nil {
		attrs = map[string]float64{}
	}
	return toxicJSON{
		Name: t.Name, Type: t.Type, Stream: t.Stream, Toxicity: t.Toxicity, Attributes: attrs,
		Port: string(t.Port), Clients: t.Clients, Seed: t.Seed, Origin: origin,
	}
}

// readBody reads a capped request body, answering 413 or 400 itself.
func readBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("request body larger than %d bytes", maxBody))
		} else {
			writeError(w, http.StatusBadRequest, "bad request body: "+err.Error())
		}
		return nil, false
	}
	return body, true
}

// withoutOrigin drops "origin" from a toxic body, so a toxic this API
// showed can be sent back as it is. The body must be a JSON object, or
// null, which is one without fields as in Toxiproxy (its decoder leaves
// the toxic as it is on null): an update changes nothing, a create has no
// type. null was refused, where Toxiproxy answers an update with the toxic.
func withoutOrigin(r *http.Request, body []byte) ([]byte, error) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(body, &fields); err != nil {
		return nil, errors.New(bodyError(r, body, err, "a JSON object (a toxic)"))
	}
	if fields == nil {
		return []byte("{}"), nil
	}
	if _, ok := fields["origin"]; !ok {
		return body, nil
	}
	delete(fields, "origin")
	return json.Marshal(fields)
}

// bodyError words a request body's JSON error in the client's terms:
// encoding/json's named the Go type it decodes into ("cannot unmarshal
// array into Go value of type map[string]json.RawMessage"), and a body
// that is not JSON at all got only its scanner's view of the first bad
// byte ("invalid character 'a' in literal null (expecting 'u')" for curl
// -d name=slow, a form). want is what the body must be.
func bodyError(r *http.Request, body []byte, err error, want string) string {
	var se *json.SyntaxError
	if errors.As(err, &se) {
		if len(bytes.TrimSpace(body)) == 0 {
			return "empty, want " + want
		}
		var msg string
		if se.Offset >= int64(len(body)) {
			msg = fmt.Sprintf("not JSON: cut short after %d bytes (%v); want %s", len(body), err, want)
		} else {
			msg = fmt.Sprintf("not JSON at byte %d (%v); want %s", se.Offset, err, want)
		}
		// The label is not checked (Toxiproxy reads any body as JSON, and
		// curl -d labels JSON as a form), but when it says the body is
		// something else, it tells why this one is not JSON.
		if ct := r.Header.Get("Content-Type"); ct != "" && !isJSONLabel(ct) {
			msg += fmt.Sprintf("; it was sent as %s; the body is read as JSON whatever its Content-Type", clip.Quote(ct))
		}
		return msg
	}
	var te *json.UnmarshalTypeError
	if !errors.As(err, &te) {
		return err.Error()
	}
	if te.Field == "" {
		return fmt.Sprintf("want %s, not a JSON %s", want, te.Value)
	}
	kind := "value"
	switch te.Type.Kind() {
	case reflect.Bool:
		kind = "boolean"
	case reflect.String:
		kind = "string"
	case reflect.Slice, reflect.Array:
		kind = "list"
	case reflect.Map, reflect.Struct:
		kind = "object"
	case reflect.Float32, reflect.Float64, reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		kind = "number"
	}
	return fmt.Sprintf("%s: must be a JSON %s, not a JSON %s", te.Field, kind, te.Value)
}

// isJSONLabel tells a Content-Type that says JSON: application/json, or a
// +json type, with any parameters.
func isJSONLabel(contentType string) bool {
	mt, _, _ := strings.Cut(contentType, ";")
	mt = strings.ToLower(strings.TrimSpace(mt))
	return mt == "application/json" || strings.HasSuffix(mt, "+json")
}

func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, apiError{Message: msg, Status: status})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	data, err := marshal(v)
	if err != nil {
		klog.ErrorS(err, "Fault API could not encode its reply")
		status = http.StatusInternalServerError
		data, _ = marshal(apiError{Message: err.Error(), Status: status})
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_, _ = w.Write(data)
}

// marshal encodes v as one line of JSON without encoding/json's HTML
// escaping: replies are JSON (nosniff) and browsers are refused, while the
// texts are read raw (curl), where "named \u003cnamespace\u003e..." hid how
// proxies are named.
func marshal(v any) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	err := enc.Encode(v) // ends with a newline
	return b.Bytes(), err
}

// proxy looks up the request's proxy; when there is none it has answered
// with Toxiproxy's 404.
func (s *server) proxy(w http.ResponseWriter, r *http.Request) (faults.ProxyInfo, bool) {
	info, err := s.table.Proxy(r.PathValue("proxy"))
	if err != nil {
		s.fail(w, r, err, false)
		return faults.ProxyInfo{}, false
	}
	return info, true
}
