package s3rdma

import (
	"crypto/rand"
	"encoding/base64"
	"os"
	"strings"
)

// The environment variables credentials come from, as for the AWS CLI.
const (
	EnvAccessKey = "AWS_ACCESS_KEY_ID"
	EnvSecretKey = "AWS_SECRET_ACCESS_KEY"
	EnvRegion    = "AWS_REGION"
)

// DefaultRegion is the region requests are signed for by default.
const DefaultRegion = "us-east-1"

// Credentials are an S3 account's keys.
type Credentials struct {
	AccessKey, SecretKey string
	Region               string // "" is DefaultRegion
}

// CredentialsFromEnv reads AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and
// AWS_REGION; ok is false when either key is unset.
func CredentialsFromEnv() (c Credentials, ok bool) {
	c = Credentials{AccessKey: os.Getenv(EnvAccessKey), SecretKey: os.Getenv(EnvSecretKey), Region: os.Getenv(EnvRegion)}
	return c, c.AccessKey != "" && c.SecretKey != ""
}

// GenerateCredentials makes a random key pair: a 20-character access key
// and a 40-character secret, the shapes AWS uses.
func GenerateCredentials() (Credentials, error) {
	b := make([]byte, 45)
	if _, err := rand.Read(b); err != nil {
		return Credentials{}, err
	}
	access := strings.ToUpper(base64.RawURLEncoding.EncodeToString(b[:15]))
	access = strings.NewReplacer("-", "X", "_", "Z").Replace(access)
	secret := base64.RawURLEncoding.EncodeToString(b[15:])
	return Credentials{AccessKey: "GR" + access[:18], SecretKey: secret[:40]}, nil
}

// Exports returns the shell lines that set c in the environment.
func (c Credentials) Exports() string {
	s := "export " + EnvAccessKey + "=" + c.AccessKey + "\nexport " + EnvSecretKey + "=" + c.SecretKey + "\n"
	if c.Region != "" {
		s += "export " + EnvRegion + "=" + c.Region + "\n"
	}
	return s
}
