package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/klog/v2"
)

// errConfigUpdated ends the proxy when --config changes, with kube-proxy's
// words: kube-proxy exits then so that its supervisor (the DaemonSet's
// kubelet) restarts it with the new file, and a ConfigMap edit reaches every
// node that way. Unlike kube-proxy, content that would not start (it does
// not decode, or a value is refused) is reported and the proxy keeps
// serving with the configuration it has, instead of exiting into a crash
// loop; and a write of the same bytes (a ConfigMap re-projected unchanged)
// changes nothing.
var errConfigUpdated = errors.New("content of the proxy server's configuration file was updated")

// configPollInterval is how often the file is read. Polling a file of a few
// hundred bytes follows any chain of symlinks (a ConfigMap volume swaps
// its ..data link) with no watch bookkeeping.
const configPollInterval = time.Second

// watchConfigFile returns errConfigUpdated once path holds content other
// than loaded that check accepts, and nil when ctx ends.
func watchConfigFile(ctx context.Context, path string, loaded []byte, check func([]byte) error, every time.Duration) error {
	t := time.NewTicker(every)
	defer t.Stop()
	last := loaded        // the content last looked at
	var lastReadErr error // reported once until it changes
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		data, err := readConfigFile(path)
		if err != nil {
			if lastReadErr == nil || err.Error() != lastReadErr.Error() {
				klog.ErrorS(err, "Cannot read --config; serving with the configuration loaded at start", "config", path)
			}
			lastReadErr = err
			continue
		}
		lastReadErr = nil
		if bytes.Equal(data, last) {
			continue
		}
		last = data
		if bytes.Equal(data, loaded) {
			klog.InfoS("--config is back to the content loaded at start", "config", path)
			continue
		}
		if err := check(data); err != nil {
			klog.ErrorS(err, "--config changed to a configuration that would not start; serving with the one loaded at start", "config", path)
			continue
		}
		klog.InfoS("--config changed; exiting so that the new configuration is loaded at restart, as kube-proxy does (live proxied connections are reset)", "config", path)
		return errConfigUpdated
	}
}

// configChecker returns the check of new --config content for a process
// started with args: the start's own parsing and validation, on fresh
// options and flags, so nothing of the running process changes (klog's -v
// included).
func configChecker(args []string) func([]byte) error {
	return func(data []byte) error {
		o := newOptions()
		fs := pflag.NewFlagSet("kube-userspace-proxy", pflag.ContinueOnError)
		fs.SetOutput(io.Discard)
		o.addFlags(fs)
		// Stand-ins for the flags runMain adds beside addFlags, so that the
		// same arguments parse (klog's own would set its global state). -v
		// with its shorthand: without it a proxy started with `-v=2` took
		// every edit for one that would not start, and never restarted.
		fs.StringP("v", "v", "0", "")
		fs.String("vmodule", "", "")
		fs.Bool("version", false, "")
		if err := fs.Parse(args); err != nil {
			return err
		}
		if err := o.applyConfigData(data, fs); err != nil {
			return err
		}
		o.noteGivenFlags(fs)
		_, err := o.validate()
		return err
	}
}
