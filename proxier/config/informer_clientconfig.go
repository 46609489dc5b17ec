package config

import (
	"cmp"
	"crypto/tls"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
)

// The content types the API client sends and accepts (what /configz shows).
const (
	ContentType        = "application/vnd.kubernetes.protobuf"
	AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
)

// deployPlaceholderHost is the KUBERNETES_SERVICE_HOST examples/deploy's
// DaemonSet carries until it is set to the control plane's address.
const deployPlaceholderHost = "CONTROL_PLANE_HOST"

// BuildClientConfig returns the API-server client configuration for --kubeconfig and
// --master, as kube-proxy builds it: with both empty, the in-cluster configuration of
// the pod's service account; otherwise the kubeconfig file, with master overriding its
// server. Requests use protobuf, which the API server serves for every type watched here.
func BuildClientConfig(kubeconfig, master string) (*rest.Config, error) {
	var cfg *rest.Config
	var err error
	if kubeconfig == "" && master == "" {
		if host := os.Getenv("KUBERNETES_SERVICE_HOST"); host == deployPlaceholderHost {
			// The pod would wait for good on a name that never resolves,
			// logged as an outage.
			return nil, fmt.Errorf("KUBERNETES_SERVICE_HOST is %s, the placeholder of examples/deploy/daemonset.yaml: set it, "+
				"and KUBERNETES_SERVICE_PORT, to the control plane's own address before applying it (examples/deploy/README.md, Deploy)", host)
		}
		cfg, err = rest.InClusterConfig()
		if errors.Is(err, rest.ErrNotInCluster) {
			return nil, errors.New("no --kubeconfig or --master given and not running in a pod (" + err.Error() + ")")
		}
		if ip, ok := throughKubernetesService(); ok && err == nil {
			klog.ErrorS(nil, "The API server is reached through the kubernetes Service's ClusterIP, which this proxy itself programs: "+
				"on a node without another proxy's rules for it (a fresh node, after kube-proxy --cleanup) or after a restart "+
				"of this proxy, it cannot reach the API server to program it. Set KUBERNETES_SERVICE_HOST and "+
				"KUBERNETES_SERVICE_PORT in the pod to the control plane's own address (examples/deploy/daemonset.yaml), "+
				"or give --kubeconfig, as kube-proxy's DaemonSet does", "clusterIP", ip)
		}
	} else {
		cfg, err = clientcmd.BuildConfigFromFlags(master, kubeconfig)
		if clientcmd.IsEmptyConfig(err) && kubeconfig != "" {
			err = namesNoCluster(kubeconfig)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("API server client configuration: %w", err)
	}
	if err := checkClientCertificate(cfg); err != nil {
		return nil, fmt.Errorf("API server client configuration: %w", err)
	}
	cfg.AcceptContentTypes = AcceptContentTypes
	cfg.ContentType = ContentType
	if cfg.UserAgent == "" {
		cfg.UserAgent = "kube-userspace-proxy"
	}
	return cfg, nil
}

// namesNoCluster says why the kubeconfig at path gives client-go no
// cluster to use (its ErrEmptyConfig: no current-context, a
// current-context whose cluster is not defined, no context at all) and
// what to do. client-go's own words, "no configuration has been provided,
// try setting KUBERNETES_MASTER environment variable", were wrong twice:
// the file was provided, and the variable is not read here
// (BuildConfigFromFlags gives client-go no cluster defaults, its only
// reader).
func namesNoCluster(path string) error {
	why, fix := "it names no cluster to use", "set its current-context to a context whose cluster has a server"
	if c, err := clientcmd.LoadFromFile(path); err == nil {
		ctx, ok := c.Contexts[c.CurrentContext]
		switch {
		case len(c.Contexts) == 0:
			why, fix = "it defines no context", "add a cluster with its server, a user and a context naming both, and set current-context"
		case c.CurrentContext == "":
			names := slices.Sorted(maps.Keys(c.Contexts))
			for i, n := range names {
				names[i] = strconv.Quote(n)
			}
			why = "it sets no current-context (its contexts: " + strings.Join(names, ", ") + ")"
			fix = "set one: kubectl config use-context NAME --kubeconfig " + path
		case ok && c.Clusters[ctx.Cluster] == nil:
			why = fmt.Sprintf("its current-context %q names cluster %q, which it does not define", c.CurrentContext, ctx.Cluster)
			fix = "define that cluster, or point the context at one that is defined"
		}
	}
	return fmt.Errorf("--kubeconfig %q names no API server: %s; %s, or give --master URL", path, why, fix)
}

// checkClientCertificate refuses a client certificate and key that are
// not a pair, as kubectl does. client-go loads files given by path only
// when it first dials, through its certificate rotation, which logs
// "Loading client cert failed" and dials with no certificate: the proxy
// then waited for good on an API server that refused it (or, unreachable,
// was "not ready"). A copy of cfg is loaded, so that cfg keeps reading the
// files again when they are rotated.
func checkClientCertificate(cfg *rest.Config) error {
	c := rest.CopyConfig(cfg)
	if err := rest.LoadTLSFiles(c); err != nil {
		return fmt.Errorf("reading its TLS files: %w", err)
	}
	if len(c.CertData) == 0 && len(c.KeyData) == 0 {
		return nil
	}
	if _, err := tls.X509KeyPair(c.CertData, c.KeyData); err != nil {
		cert, key := cmp.Or(cfg.CertFile, "client-certificate-data"), cmp.Or(cfg.KeyFile, "client-key-data")
		return fmt.Errorf("the client certificate %s and key %s are not a valid pair: %w", cert, key, err)
	}
	return nil
}

// throughKubernetesService reports whether the in-cluster configuration
// points at the kubernetes Service's ClusterIP: KUBERNETES_SERVICE_HOST is
// still the address the kubelet gave the Service's own variables
// (KUBERNETES_PORT_<port>_TCP_ADDR). A pod that sets the host to the
// control plane leaves the kubelet's other variables as they were, so
// they then differ.
func throughKubernetesService() (string, bool) {
	host, port := os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT")
	if host == "" || port == "" {
		return "", false
	}
	return host, os.Getenv("KUBERNETES_PORT_"+port+"_TCP_ADDR") == host
}
