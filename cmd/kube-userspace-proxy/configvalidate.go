package main

import (
	"slices"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	fieldpath "k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/component-base/featuregate"
	logsapi "k8s.io/component-base/logs/api/v1"
	kubeproxyconfig "k8s.io/kube-proxy/config/v1alpha1"
	netutils "k8s.io/utils/net"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/clip"
)

// validateConfigFields checks the fields of a --config file that the
// options' validation does not see, with kube-proxy's rules and words
// (k8s.io/kubernetes pkg/proxy/apis/config/validation): the fields this
// proxy does not act on, which were taken whatever they held, so a file
// kube-proxy refuses (iptables.masqueradeBit: 99) started here. Every
// error is returned, one line each naming its field as the file spells
// it, for validate to report with the others. The fields applied to
// options (bindAddress, the sync periods...) are the options' to check,
// with the flag and the field named.
//
// Not checked: featureGates (kube-proxy's gates are kube-proxy's; only
// the logging gates are known here) and showHiddenMetricsForVersion
// (valid only against kube-proxy's own version). Nor the fields of
// flagFields, which hold a flag's value (withLoggingFlags): the flag's
// check names it.
func validateConfigFields(c *kubeproxyconfig.KubeProxyConfiguration, flagFields map[string]bool) []string {
	var msgs []string
	for _, e := range kubeProxyFieldErrors(c) {
		if flagFields[e.Field] {
			continue
		}
		msgs = append(msgs, oneLine(clip.Quoted(e.Error())))
	}
	return msgs
}

// kubeProxyFieldErrors is kube-proxy's validation of the fields of c that
// this proxy does not act on (validateConfigFields), the errors naming the
// fields by their path in a file.
func kubeProxyFieldErrors(c *kubeproxyconfig.KubeProxyConfiguration) fieldpath.ErrorList {
	var errs fieldpath.ErrorList
	add := func(err *fieldpath.Error) { errs = append(errs, err) }
	bit := func(path *fieldpath.Path, v *int32) {
		if v != nil && (*v < 0 || *v > 31) {
			add(fieldpath.Invalid(path, *v, "must be within the range [0, 31]"))
		}
	}
	nonNegative := func(path *fieldpath.Path, v *int32) {
		if v != nil && *v < 0 {
			add(fieldpath.Invalid(path, *v, "must be greater than or equal to 0"))
		}
	}
	notNegative := func(path *fieldpath.Path, d *metav1.Duration) {
		if d != nil && d.Duration < 0 {
			add(fieldpath.Invalid(path, d.Duration.String(), "must be greater than or equal to 0"))
		}
	}

	bit(fieldpath.NewPath("iptables", "masqueradeBit"), c.IPTables.MasqueradeBit)
	// kube-proxy checks a mode's own block only in that mode (which this
	// proxy refuses: the mode's error comes with these).
	switch c.Mode {
	case "ipvs":
		ipvs := fieldpath.NewPath("ipvs")
		notNegative(ipvs.Child("tcpTimeout"), &c.IPVS.TCPTimeout)
		notNegative(ipvs.Child("tcpFinTimeout"), &c.IPVS.TCPFinTimeout)
		notNegative(ipvs.Child("udpTimeout"), &c.IPVS.UDPTimeout)
		for i, cidr := range c.IPVS.ExcludeCIDRs {
			if _, _, err := netutils.ParseCIDRSloppy(cidr); err != nil {
				add(fieldpath.Invalid(ipvs.Child("excludeCIDRs").Index(i), cidr, "must be a valid CIDR"))
			}
		}
	case "nftables":
		bit(fieldpath.NewPath("nftables", "masqueradeBit"), c.NFTables.MasqueradeBit)
	}

	ct := fieldpath.NewPath("conntrack")
	nonNegative(ct.Child("maxPerCore"), c.Conntrack.MaxPerCore)
	nonNegative(ct.Child("min"), c.Conntrack.Min)
	notNegative(ct.Child("tcpEstablishedTimeout"), c.Conntrack.TCPEstablishedTimeout)
	notNegative(ct.Child("tcpCloseWaitTimeout"), c.Conntrack.TCPCloseWaitTimeout)
	notNegative(ct.Child("udpTimeout"), &c.Conntrack.UDPTimeout)
	notNegative(ct.Child("udpStreamTimeout"), &c.Conntrack.UDPStreamTimeout)
	if v := c.OOMScoreAdj; v != nil && (*v < -1000 || *v > 1000) {
		add(fieldpath.Invalid(fieldpath.NewPath("oomScoreAdj"), *v, "must be within the range [-1000, 1000]"))
	}

	if !slices.Contains(detectLocalModes, string(c.DetectLocalMode)) {
		add(fieldpath.NotSupported(fieldpath.NewPath("detectLocalMode"), string(c.DetectLocalMode), detectLocalModes[1:]))
	}
	switch c.DetectLocalMode {
	case "BridgeInterface":
		if c.DetectLocal.BridgeInterface == "" {
			add(fieldpath.Invalid(fieldpath.NewPath("detectLocal", "bridgeInterface"), "", "must not be empty"))
		}
	case "InterfaceNamePrefix":
		if c.DetectLocal.InterfaceNamePrefix == "" {
			add(fieldpath.Invalid(fieldpath.NewPath("detectLocal", "interfaceNamePrefix"), "", "must not be empty"))
		}
	}

	return append(errs, validateLogging(c)...)
}

// validateLogging is component-base's check of logging, which kube-proxy
// runs on its file's: after kube-proxy's defaulting (a flush frequency of
// 0 is the default's 5s), with the logging gates the file's featureGates
// set. The json format, which kube-proxy builds in and this proxy does
// not (it is ignored, see applyConfig), is checked as text, save that
// vmodule is for text only.
func validateLogging(c *kubeproxyconfig.KubeProxyConfiguration) fieldpath.ErrorList {
	path := fieldpath.NewPath("logging")
	lg := *c.Logging.DeepCopy()
	if lg.FlushFrequency.Duration.Duration == 0 {
		lg.FlushFrequency.Duration.Duration = 5 * time.Second
	}
	var errs fieldpath.ErrorList
	switch lg.Format {
	case "", "text":
		lg.Format = "text"
	case "json":
		if len(lg.VModule) > 0 {
			errs = append(errs, fieldpath.Forbidden(path.Child("vmodule"), "Only supported for text log format"))
		}
		lg.Format = "text"
	}
	gates := featuregate.NewFeatureGate()
	if err := logsapi.AddFeatureGates(gates); err != nil {
		return append(errs, fieldpath.InternalError(path, err))
	}
	known := gates.GetAll()
	logging := map[string]bool{}
	for name, on := range c.FeatureGates {
		if _, ok := known[featuregate.Feature(name)]; ok {
			logging[name] = on
		}
	}
	if err := gates.SetFromMap(logging); err != nil {
		errs = append(errs, fieldpath.Invalid(fieldpath.NewPath("featureGates"), logging, err.Error()))
	}
	return append(errs, logsapi.Validate(&lg, gates, path)...)
}
