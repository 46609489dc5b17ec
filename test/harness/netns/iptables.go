package netns

import "strings"

// IPTablesSave returns `iptables-save` (or `ip6tables-save` when v6) for the
// namespace, with the comment and counter lines that change on every call
// removed, so two dumps can be compared line by line.
func (n *NS) IPTablesSave(v6 bool) (string, error) {
	tool := "iptables-save"
	if v6 {
		tool = "ip6tables-save"
	}
	out, err := n.Exec(tool)
	if err != nil {
		return "", err
	}
	var keep []string
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "#") || line == "" {
			continue
		}
		if strings.HasPrefix(line, ":") { // ":CHAIN POLICY [packets:bytes]"
			if i := strings.LastIndex(line, " ["); i > 0 {
				line = line[:i]
			}
		}
		keep = append(keep, line)
	}
	return strings.Join(keep, "\n") + "\n", nil
}
