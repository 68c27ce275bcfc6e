package perfrun

import (
	"fmt"

	"github.com/goroce/goroce/roce"
)

// ccUsage documents the --cc flag.
const ccUsage = "congestion `control`: none, or dcqcn (ECT(0) on sent packets, CNPs for CE-marked ones, " +
	"per-QP DCQCN rate with mlx5's defaults)"

// parseCC turns a --cc value into the device's setting.
func parseCC(s string) (roce.CCConfig, error) {
	switch s {
	case "none", "":
		return roce.CCConfig{}, nil
	case "dcqcn":
		return roce.CCConfig{DCQCN: true}, nil
	}
	return roce.CCConfig{}, fmt.Errorf("--cc %q: none or dcqcn", s)
}
