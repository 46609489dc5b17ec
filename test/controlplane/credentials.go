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
	rows := []string{
		// token,user,uid,"group,group"
		fmt.Sprintf(`%s,%s,%s,"system:masters"`, c.adminToken, AdminUser, AdminUser),
		fmt.Sprintf(`%s,%s,%s,"system:serviceaccounts,system:serviceaccounts:%s"`,
			c.proxyToken, ProxyUser, ProxyServiceAccount, ProxyNamespace),
	}
	if err := os.WriteFile(c.tokenFile, []byte(strings.Join(rows, "\n")+"\n"), 0o600); err != nil {
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

func randomToken() string {
	b := make([]byte, 24)
	_, _ = rand.Read(b) // never fails on Linux
	return hex.EncodeToString(b)
}
