package draverify

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"regexp"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
)

// apiProxy serves the driver the API server: a reverse proxy on loopback,
// with TLS of a certificate authority made for the run (in the driver's
// kubeconfig), that forwards the driver's requests with its own bearer
// token and records every request the API server's authorizer forbids.
// That is how dra.rbac knows a driver needs more than its RBAC, whatever
// the driver logs.
type apiProxy struct {
	url   string // https://127.0.0.1:PORT
	caPEM []byte
	srv   *http.Server
	done  chan struct{}
	log   *slog.Logger
	// prefix is the path of the API server's address, which the
	// requests it gets start with.
	prefix string

	requests atomic.Int64
	mu       sync.Mutex
	denied   map[string]*denial // by what was denied
	// refused: writes of claims' status refused as invalid (claimstatus.go).
	refused statusRefusals
}

// denial is one kind of request the API server forbade the driver.
type denial struct {
	what      string // `get resource "resourceclaims" in API group "resource.k8s.io"`
	namespace string
	count     int
	message   string // the API server's, of the first
}

// requestInfo resolves a request's verb, API group, resource and
// namespace as the API server does.
var requestInfo = &request.RequestInfoFactory{APIPrefixes: sets.NewString("api", "apis"), GrouplessAPIPrefixes: sets.NewString("api")}

// forbiddenByAuthorizer matches the message of a request the API server's
// authorizer forbade (k8s.io/apiserver responsewriters.forbiddenMessage),
// not one an admission plugin refused with 403.
var forbiddenByAuthorizer = regexp.MustCompile(`User "[^"]*" cannot `)

// startProxy starts the proxy to the API server of upstream. It forwards
// no credential of upstream: only its address and what verifies the API
// server's certificate.
func startProxy(upstream *rest.Config, validFor time.Duration, log *slog.Logger) (*apiProxy, error) {
	target, err := url.Parse(upstream.Host)
	if err != nil {
		return nil, fmt.Errorf("the API server's address %q: %w", upstream.Host, err)
	}
	if target.Scheme == "" {
		target, err = url.Parse("https://" + upstream.Host)
		if err != nil {
			return nil, fmt.Errorf("the API server's address %q: %w", upstream.Host, err)
		}
	}
	anon := rest.AnonymousClientConfig(upstream)
	transport, err := rest.TransportFor(anon)
	if err != nil {
		return nil, fmt.Errorf("a transport to the API server: %w", err)
	}
	caPEM, cert, err := loopbackTLS(validFor)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &apiProxy{url: "https://" + ln.Addr().String(), caPEM: caPEM, done: make(chan struct{}), log: log, denied: map[string]*denial{},
		prefix: strings.TrimSuffix(target.Path, "/")}
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			pr.Out.Host = target.Host
		},
		Transport: transport,
		// Watches stream: every event goes on at once.
		FlushInterval:  -1,
		ModifyResponse: p.record,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			log.Debug("Cannot forward the driver's request to the API server", "method", r.Method, "path", r.URL.Path, "err", err)
			w.WriteHeader(http.StatusBadGateway)
		},
		ErrorLog: slog.NewLogLogger(debugHandler{log.Handler()}, slog.LevelDebug),
	}
	p.srv = &http.Server{
		Handler:           http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { p.requests.Add(1); rp.ServeHTTP(w, r) }),
		TLSConfig:         &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12},
		ReadHeaderTimeout: 30 * time.Second,
		ErrorLog:          slog.NewLogLogger(debugHandler{log.Handler()}, slog.LevelDebug),
	}
	go func() {
		defer close(p.done)
		_ = p.srv.ServeTLS(ln, "", "")
	}()
	return p, nil
}

// stop closes the proxy and every connection the driver has to it.
func (p *apiProxy) stop() {
	_ = p.srv.Close()
	<-p.done
}

// record notes a response that forbids the driver a request before the
// driver has it, so that what the driver does then is judged knowing it.
func (p *apiProxy) record(resp *http.Response) error {
	p.noteRefused(resp) // dra.claim.status-devices
	if resp.StatusCode != http.StatusForbidden {
		return nil
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	_ = resp.Body.Close()
	resp.Body = io.NopCloser(bytes.NewReader(body))
	if err != nil {
		return err
	}
	msg := statusMessage(body)
	if !forbiddenByAuthorizer.Match(body) && !forbiddenByAuthorizer.MatchString(msg) {
		p.log.Debug("The API server refused a request of the driver, not by authorization", "method", resp.Request.Method, "path", resp.Request.URL.Path, "message", msg)
		return nil
	}
	in := resp.Request.Clone(resp.Request.Context())
	in.URL.Path = strings.TrimPrefix(in.URL.Path, p.prefix)
	what, ns := describe(in)
	p.mu.Lock()
	defer p.mu.Unlock()
	key := what + " " + ns
	d := p.denied[key]
	if d == nil {
		d = &denial{what: what, namespace: ns, message: msg}
		p.denied[key] = d
	}
	d.count++
	p.log.Debug("The driver was forbidden a request", "request", what, "namespace", ns, "message", msg)
	return nil
}

// statusMessage is the message of a Status in JSON or protobuf, or "".
func statusMessage(body []byte) string {
	obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(body, nil, nil)
	if st, ok := obj.(*metav1.Status); err == nil && ok {
		return st.Message
	}
	return ""
}

// describe names what a request asks for the way an RBAC rule grants it:
// its verb, resource (with subresource) and API group, or its path; and
// its namespace.
func describe(r *http.Request) (what, namespace string) {
	info, err := requestInfo.NewRequestInfo(r)
	switch {
	case err != nil:
		return fmt.Sprintf("%s path %q", strings.ToLower(r.Method), r.URL.Path), ""
	case !info.IsResourceRequest:
		return fmt.Sprintf("%s path %q", info.Verb, info.Path), ""
	}
	res := info.Resource
	if info.Subresource != "" {
		res += "/" + info.Subresource
	}
	group := fmt.Sprintf("in API group %q", info.APIGroup)
	if info.APIGroup == "" {
		group = "in the core API group"
	}
	return fmt.Sprintf("%s resource %q %s", info.Verb, res, group), info.Namespace
}

// denials lists what was forbidden, in order.
func (p *apiProxy) denials() []denial {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]denial, 0, len(p.denied))
	for _, d := range p.denied {
		out = append(out, *d)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].what != out[j].what {
			return out[i].what < out[j].what
		}
		return out[i].namespace < out[j].namespace
	})
	return out
}

// anyDenied reports whether a request was forbidden.
func (p *apiProxy) anyDenied() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.denied) > 0
}

func (d denial) String() string {
	s := d.what
	if d.namespace != "" {
		s += " in namespace " + d.namespace
	}
	if d.count > 1 {
		s += fmt.Sprintf(" (%d times)", d.count)
	}
	return s
}

// loopbackTLS makes a certificate authority and, signed by it, a serving
// certificate for 127.0.0.1, both valid for validFor.
func loopbackTLS(validFor time.Duration) (caPEM []byte, cert tls.Certificate, err error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, cert, err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "dpkit verify --dra proxy CA"},
		NotBefore: now.Add(-time.Minute), NotAfter: now.Add(validFor),
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true, IsCA: true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, cert, err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, cert, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, cert, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: now.Add(-time.Minute), NotAfter: now.Add(validFor),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, DNSNames: []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, cert, err
	}
	cert = tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), cert, nil
}

// errNoRequests: the driver asked the API server nothing.
var errNoRequests = errors.New("no requests")

// rbacVerdict judges dra.rbac from what the proxy saw.
func (p *apiProxy) rbacVerdict(source string) (pass bool, detail string, err error) {
	ds := p.denials()
	if len(ds) > 0 {
		var what []string
		for _, d := range ds {
			what = append(what, d.String())
		}
		return false, fmt.Sprintf("the API server forbade the driver, granted %s: %s; the first refusal: %q",
			source, strings.Join(what, "; "), ds[0].message), nil
	}
	n := p.requests.Load()
	if n == 0 {
		return false, "", errNoRequests
	}
	return true, fmt.Sprintf("none of the driver's %d requests to the API server was forbidden, granted %s", n, source), nil
}
