package main

import (
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestStaticBuild builds the binary as the image does (`make static`) and
// checks that it needs no dynamic loader, so it runs on any base image,
// that it reports the version given at link time, and that its --help
// lists every flag the DaemonSet passes.
func TestStaticBuild(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the whole binary without cgo (a minute or more on a cold cache)")
	}
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("make is not installed")
	}
	bin := filepath.Join(t.TempDir(), "kube-userspace-proxy")
	const version = "v0.0.0-statictest"
	cmd := exec.Command("make", "-s", "static", "STATIC_OUT="+bin, "VERSION="+version)
	cmd.Dir = repoRoot
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make static: %v\n%s", err, out)
	}

	// No PT_INTERP: the kernel runs it without ld.so, and it links no
	// shared library.
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Errorf("%s has a PT_INTERP program header: it is dynamically linked", bin)
		}
	}
	if libs, _ := f.ImportedLibraries(); len(libs) > 0 {
		t.Errorf("%s needs shared libraries %v", bin, libs)
	}
	if _, err := exec.LookPath("ldd"); err == nil {
		// ldd exits 1 for a static binary; its words are what matter.
		out, _ := exec.Command("ldd", bin).CombinedOutput()
		if !strings.Contains(string(out), "not a dynamic executable") && !strings.Contains(string(out), "statically linked") {
			t.Errorf("ldd %s: %s", bin, out)
		}
		t.Logf("ldd: %s", strings.TrimSpace(string(out)))
	}

	out, err := exec.Command(bin, "--version").Output()
	if err != nil || !strings.Contains(string(out), version) {
		t.Errorf("--version: %q, %v; want %s in it", out, err, version)
	}
	help, err := exec.Command(bin, "--help").Output()
	if err != nil {
		t.Fatalf("--help: %v", err)
	}
	ds, _, _ := readDeploy(t)
	for _, a := range ds.Spec.Template.Spec.Containers[0].Args {
		name, _, _ := strings.Cut(a, "=")
		if !strings.Contains(string(help), "      "+name+" ") && !strings.Contains(string(help), ", "+name+" ") {
			t.Errorf("the DaemonSet passes %s, which the binary's --help does not list", name)
		}
	}
	if fi, err := os.Stat(bin); err == nil {
		t.Logf("static binary: %.1f MiB", float64(fi.Size())/(1<<20))
	}
}
