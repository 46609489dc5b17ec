package controlplane

import (
	"path/filepath"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// writeKubeconfigs writes admin.kubeconfig and proxy.kubeconfig, for programs (the proxy
// binary) that take --kubeconfig. The CA is embedded so the files stay valid on their own.
func (cp *ControlPlane) writeKubeconfigs() error {
	cp.AdminKubeconfig = filepath.Join(cp.dir, "admin.kubeconfig")
	cp.ProxyKubeconfig = filepath.Join(cp.dir, "proxy.kubeconfig")
	if err := writeKubeconfig(cp.AdminKubeconfig, cp.Server, cp.CAFile, AdminUser, cp.AdminToken); err != nil {
		return err
	}
	return writeKubeconfig(cp.ProxyKubeconfig, cp.Server, cp.CAFile, ProxyServiceAccount, cp.ProxyToken)
}

func writeKubeconfig(path, server, caFile, user, token string) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["test"] = &clientcmdapi.Cluster{Server: server, CertificateAuthority: caFile}
	cfg.AuthInfos[user] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts["test"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: user}
	cfg.CurrentContext = "test"
	if err := clientcmdapi.FlattenConfig(cfg); err != nil { // embeds the CA file
		return err
	}
	return clientcmd.WriteToFile(*cfg, path)
}
