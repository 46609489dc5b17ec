package controlplane

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// The identities the token file defines.
const (
	AdminUser = "kup-admin"
	// ProxyNamespace and ProxyServiceAccount name the service account examples/deploy
	// binds; the proxy token authenticates as that account, so the manifests' RBAC is
	// exactly what it may do.
	ProxyNamespace      = "kube-system"
	ProxyServiceAccount = "kube-userspace-proxy"
)

// ProxyUser is the user name the proxy token authenticates as.
const ProxyUser = "system:serviceaccount:" + ProxyNamespace + ":" + ProxyServiceAccount

// credentials are the files kube-apiserver reads at start.
type credentials struct {
	adminToken, proxyToken string
	tokenFile              string // CSV for --token-auth-file
	serviceAccountKey      string // PEM EC private key: signing key and, via its public half, verification key
}

// writeCredentials creates fresh tokens and a service-account key in dir.
func writeCredentials(dir string) (credentials, error) {
	c := credentials{
		adminToken:        randomToken(),
		proxyToken:        randomToken(),
		tokenFile:         filepath.Join(dir, "tokens.csv"),
		serviceAccountKey: filepath.Join(dir, "service-account.key"),
	}
	if err := writeTokenFile(c.tokenFile, c.adminToken, c.proxyToken); err != nil {
		return c, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return c, err
	}
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return c, err
	}
	pemKey := pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der})
	return c, os.WriteFile(c.serviceAccountKey, pemKey, 0o600)
}

// writeTokenFile writes the --token-auth-file of the two identities.
func writeTokenFile(path, adminToken, proxyToken string) error {
	rows := []string{
		// token,user,uid,"group,group"
		fmt.Sprintf(`%s,%s,%s,"system:masters"`, adminToken, AdminUser, AdminUser),
		fmt.Sprintf(`%s,%s,%s,"system:serviceaccounts,system:serviceaccounts:%s"`,
			proxyToken, ProxyUser, ProxyServiceAccount, ProxyNamespace),
	}
	return os.WriteFile(path, []byte(strings.Join(rows, "\n")+"\n"), 0o600)
}

// RotateProxyToken gives ProxyUser a new token in place of its current one
// and returns it. kube-apiserver reads its token file at start: the new
// token is accepted, and the old one refused, from the next StartAPIServer
// on. ProxyToken, ProxyConfig and ProxyKubeconfig keep the first token
// (the exported fields do not change): a test that rotates hands the new
// one to its clients itself.
func (cp *ControlPlane) RotateProxyToken() (string, error) {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	token := randomToken()
	if err := writeTokenFile(cp.creds.tokenFile, cp.creds.adminToken, token); err != nil {
		return "", err
	}
	cp.creds.proxyToken = token
	return token, nil
}

func randomToken() string {
	b := make([]byte, 24)
	_, _ = rand.Read(b) // never fails on Linux
	return hex.EncodeToString(b)
}
