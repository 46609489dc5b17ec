package main

import (
	"errors"

	"github.com/spf13/pflag"
)

// applyConfigFile loads --config; flags given on the command line win.
func (o *options) applyConfigFile(fs *pflag.FlagSet) error {
	return errors.New("not supported yet")
}
