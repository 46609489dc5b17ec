package config

import (
	"errors"
	"fmt"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// BuildClientConfig returns the API-server client configuration for --kubeconfig and
// --master, as kube-proxy builds it: with both empty, the in-cluster configuration of
// the pod's service account; otherwise the kubeconfig file, with master overriding its
// server. Requests use protobuf, which the API server serves for every type watched here.
func BuildClientConfig(kubeconfig, master string) (*rest.Config, error) {
	var cfg *rest.Config
	var err error
	if kubeconfig == "" && master == "" {
		cfg, err = rest.InClusterConfig()
		if errors.Is(err, rest.ErrNotInCluster) {
			return nil, errors.New("no --kubeconfig or --master given and not running in a pod (" + err.Error() + ")")
		}
	} else {
		cfg, err = clientcmd.BuildConfigFromFlags(master, kubeconfig)
	}
	if err != nil {
		return nil, fmt.Errorf("API server client configuration: %w", err)
	}
	cfg.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	cfg.ContentType = "application/vnd.kubernetes.protobuf"
	if cfg.UserAgent == "" {
		cfg.UserAgent = "kube-userspace-proxy"
	}
	return cfg, nil
}
