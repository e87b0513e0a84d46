package config

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// Key files for the tests, made once per run in a shared temporary directory.
var (
	fixturesOnce sync.Once
	fixturesDir  string
	fixturesErr  error
)

// fixtures returns a directory holding rsa.pem (an RSA public key), ec256.pem and ec384.pem
// (ECDSA public keys), ed25519.pem, cert.pem and key.pem (a self-signed certificate and its key),
// operators-ca.pem and xds-ca.pem (the certificate again, as a CA), garbage.pem (no PEM), private.pem (an
// EC private key, not a public one).
func fixtures(t testing.TB) string {
	t.Helper()
	fixturesOnce.Do(func() { fixturesDir, fixturesErr = makeFixtures() })
	if fixturesErr != nil {
		t.Fatal(fixturesErr)
	}
	return fixturesDir
}

func makeFixtures() (string, error) {
	dir, err := os.MkdirTemp("", "sluice-config-test-")
	if err != nil {
		return "", err
	}
	write := func(name, typ string, der []byte) error {
		return os.WriteFile(filepath.Join(dir, name), pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600)
	}
	rk, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return "", err
	}
	der, _ := x509.MarshalPKIXPublicKey(&rk.PublicKey)
	if err := write("rsa.pem", "PUBLIC KEY", der); err != nil {
		return "", err
	}
	for name, curve := range map[string]elliptic.Curve{"ec256.pem": elliptic.P256(), "ec384.pem": elliptic.P384()} {
		k, err := ecdsa.GenerateKey(curve, rand.Reader)
		if err != nil {
			return "", err
		}
		der, _ := x509.MarshalPKIXPublicKey(&k.PublicKey)
		if err := write(name, "PUBLIC KEY", der); err != nil {
			return "", err
		}
	}
	edPub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return "", err
	}
	der, _ = x509.MarshalPKIXPublicKey(edPub)
	if err := write("ed25519.pem", "PUBLIC KEY", der); err != nil {
		return "", err
	}
	ck, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "localhost"}, DNSNames: []string{"localhost"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
	}
	cert, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &ck.PublicKey, ck)
	if err != nil {
		return "", err
	}
	keyDER, _ := x509.MarshalECPrivateKey(ck)
	for _, f := range []struct {
		name, typ string
		der       []byte
	}{{"cert.pem", "CERTIFICATE", cert}, {"key.pem", "EC PRIVATE KEY", keyDER}, {"private.pem", "EC PRIVATE KEY", keyDER},
		{"operators-ca.pem", "CERTIFICATE", cert}, {"xds-ca.pem", "CERTIFICATE", cert}} {
		if err := write(f.name, f.typ, f.der); err != nil {
			return "", err
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "garbage.pem"), []byte("not a key\n"), 0o600); err != nil {
		return "", err
	}
	return dir, nil
}

func TestMain(m *testing.M) {
	code := m.Run()
	if fixturesDir != "" {
		os.RemoveAll(fixturesDir)
	}
	os.Exit(code)
}

// sum returns the lower-case hex SHA-256 of key.
func sum(key string) string {
	s := sha256.Sum256([]byte(key))
	return hex.EncodeToString(s[:])
}

// testEnv is the environment the tests parse in.
var testEnv = map[string]string{
	"JWT_SECRET":           "a-secret-of-at-least-64-bytes-for-hs512-0123456789abcdef0123456789",
	"SHORT_SECRET":         "too-short",
	"EMPTY":                "",
	"REDIS_PASSWORD":       "hunter2-redis-password",
	"SLUICE_ADMIN_TOKEN":   "an-admin-token",
	"SENTINEL_PASSWORD":    "a-sentinel-password",
	"SLUICE_CI_TOKEN":      "a-ci-token",
	"SLUICE_BILLING_TOKEN": "a-billing-token",
}

func lookupEnv(k string) (string, bool) { v, ok := testEnv[k]; return v, ok }

// parseTest parses yaml as the file "config.yaml", with $DIR replaced by the fixtures' directory.
func parseTest(t testing.TB, yaml string) (*Config, error) {
	t.Helper()
	if strings.Contains(yaml, "$DIR") {
		yaml = strings.ReplaceAll(yaml, "$DIR", fixtures(t))
	}
	return parse([]byte(yaml), "config.yaml", lookupEnv)
}
