package main

import (
	"bufio"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/pflag"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/yaml"
)

// The container image recipe cannot be built here (no container engine), so
// these tests hold its parts together: the Dockerfile against the
// repository and the Makefile, the DaemonSet against the Dockerfile, the
// binary's flags and the ConfigMap, the README against the image name.

// repoRoot is the module root, relative to this package.
var repoRoot = filepath.Join("..", "..")

const deployDir = "examples/deploy"

func readRepoFile(t *testing.T, rel string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(repoRoot, rel))
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// dockerInstruction is one instruction of a Dockerfile, continuation lines
// joined.
type dockerInstruction struct {
	stage string // the FROM ... AS name it belongs to ("" before any AS)
	op    string // COPY, RUN, FROM, ...
	args  []string
	line  string
}

func parseDockerfile(t *testing.T, text string) []dockerInstruction {
	t.Helper()
	var out []dockerInstruction
	var cur strings.Builder
	stage := ""
	flush := func() {
		line := strings.TrimSpace(cur.String())
		cur.Reset()
		if line == "" {
			return
		}
		fields := strings.Fields(line)
		in := dockerInstruction{op: strings.ToUpper(fields[0]), args: fields[1:], line: line}
		if in.op == "FROM" {
			stage = ""
			if n := len(fields); n >= 4 && strings.EqualFold(fields[n-2], "AS") {
				stage = fields[n-1]
			}
		}
		in.stage = stage
		out = append(out, in)
	}
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(strings.TrimSpace(line), "#") {
			continue
		}
		if strings.HasSuffix(line, "\\") {
			cur.WriteString(strings.TrimSuffix(line, "\\") + " ")
			continue
		}
		cur.WriteString(line)
		flush()
	}
	flush()
	return out
}

// goBuild is what a `go build` command line builds: the flags the image
// depends on and the package.
type goBuild struct {
	line, pkg, out string
}

var goBuildRE = regexp.MustCompile(`(?:go|\$\(GO\)) build .*-o (\S+) (\./\S+)\s*$`)

func parseGoBuild(t *testing.T, where, line string) goBuild {
	t.Helper()
	m := goBuildRE.FindStringSubmatch(line)
	if m == nil {
		t.Fatalf("%s: no `go build ... -o OUT ./PKG` in %q", where, line)
	}
	b := goBuild{line: line, out: m[1], pkg: m[2]}
	for _, want := range []string{"CGO_ENABLED=0", "-trimpath", "-X main.version="} {
		if !strings.Contains(line, want) {
			t.Errorf("%s: the build lacks %s: %q", where, want, line)
		}
	}
	// The package exists and is a command.
	files, _ := filepath.Glob(filepath.Join(repoRoot, b.pkg, "*.go"))
	isMain := false
	for _, f := range files {
		data, _ := os.ReadFile(f)
		isMain = isMain || regexp.MustCompile(`(?m)^package main$`).Match(data)
	}
	if !isMain {
		t.Errorf("%s: %s is not a main package of this module", where, b.pkg)
	}
	return b
}

// imageRecipe is what the Dockerfile says about the image.
type imageRecipe struct {
	binary    string // where the final stage puts the binary
	goVersion string // ARG GO_VERSION
	name      string // the tag its header comment builds
}

func lintDockerfile(t *testing.T) imageRecipe {
	t.Helper()
	text := readRepoFile(t, "Dockerfile")
	var r imageRecipe
	if m := regexp.MustCompile(`docker build -t (\S+)`).FindStringSubmatch(text); m != nil {
		r.name = m[1]
	}
	builds := map[string]goBuild{} // by stage
	var final []dockerInstruction
	stages := 0
	for _, in := range parseDockerfile(t, text) {
		switch in.op {
		case "ARG":
			if v, ok := strings.CutPrefix(in.args[0], "GO_VERSION="); ok {
				r.goVersion = v
			}
		case "FROM":
			stages++
			final = nil
		case "RUN":
			if strings.Contains(in.line, "go build") {
				builds[in.stage] = parseGoBuild(t, "Dockerfile", in.line)
			}
		case "COPY":
			var from string
			var paths []string
			for _, a := range in.args {
				if v, ok := strings.CutPrefix(a, "--from="); ok {
					from = v
				} else if !strings.HasPrefix(a, "--") {
					paths = append(paths, a)
				}
			}
			srcs, dst := paths[:len(paths)-1], paths[len(paths)-1]
			for _, src := range srcs {
				if from != "" {
					b, ok := builds[from]
					if !ok || b.out != src {
						t.Errorf("Dockerfile: %q copies %s from stage %q, which builds %q", in.line, src, from, b.out)
					}
					continue
				}
				if m, _ := filepath.Glob(filepath.Join(repoRoot, src)); len(m) == 0 {
					t.Errorf("Dockerfile: %q: %s is not in the repository", in.line, src)
				}
			}
			if from != "" {
				r.binary = dst
			}
		}
		if in.op != "FROM" {
			final = append(final, in)
		}
	}
	if stages < 2 || len(builds) == 0 {
		t.Errorf("Dockerfile: want a build stage and a runtime stage, got %d stages, builds in %v", stages, builds)
	}
	finalText := ""
	for _, in := range final {
		finalText += in.line + "\n"
	}
	if !strings.Contains(finalText, "iptables") || !strings.Contains(finalText, "ip6tables") {
		t.Errorf("Dockerfile: the final stage does not install and select iptables and ip6tables:\n%s", finalText)
	}
	// .dockerignore must not leave out what the build compiles.
	for _, line := range strings.Split(readRepoFile(t, ".dockerignore"), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		for _, need := range []string{"go.mod", "go.sum", "cmd", "proxier", "demo", "test/harness"} {
			if line == need || strings.HasPrefix(need, line+"/") {
				t.Errorf(".dockerignore leaves out %s, which the build needs", need)
			}
		}
	}
	return r
}

func TestImageRecipe(t *testing.T) {
	recipe := lintDockerfile(t)

	// The Makefile's static build is the Dockerfile's.
	static := regexp.MustCompile(`(?m)^static:\n\t(.+)$`).FindStringSubmatch(readRepoFile(t, "Makefile"))
	if static == nil {
		t.Fatal("Makefile has no static target")
	}
	parseGoBuild(t, "Makefile static", static[1])

	// The image's Go is the one go.mod asks for.
	goMod := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindStringSubmatch(readRepoFile(t, "go.mod"))
	if goMod == nil || recipe.goVersion != goMod[1] {
		t.Errorf("Dockerfile GO_VERSION %q, go.mod says %v", recipe.goVersion, goMod)
	}

	ds, cm, rbac := readDeploy(t)
	if len(ds.Spec.Template.Spec.Containers) != 1 {
		t.Fatalf("DaemonSet has %d containers, want 1", len(ds.Spec.Template.Spec.Containers))
	}
	c := ds.Spec.Template.Spec.Containers[0]

	// One image name everywhere.
	if recipe.name == "" || c.Image != recipe.name {
		t.Errorf("DaemonSet image %q, Dockerfile builds %q", c.Image, recipe.name)
	}
	for _, doc := range []string{"README.md", deployDir + "/README.md"} {
		text := readRepoFile(t, doc)
		for _, cmd := range []string{"docker build -t " + c.Image, "kind load docker-image " + c.Image, "ctr -n k8s.io images import"} {
			if !strings.Contains(text, cmd) {
				t.Errorf("%s does not say %q", doc, cmd)
			}
		}
	}
	if len(c.Command) == 0 || c.Command[0] != recipe.binary {
		t.Errorf("DaemonSet runs %v, the image has the binary at %s", c.Command, recipe.binary)
	}

	// What a node agent needs.
	spec := ds.Spec.Template.Spec
	if !spec.HostNetwork {
		t.Error("DaemonSet is not on the host network")
	}
	privileged := c.SecurityContext != nil && c.SecurityContext.Privileged != nil && *c.SecurityContext.Privileged
	var caps []corev1.Capability
	if c.SecurityContext != nil && c.SecurityContext.Capabilities != nil {
		caps = c.SecurityContext.Capabilities.Add
	}
	if !privileged && (!slices.Contains(caps, "NET_ADMIN") || !slices.Contains(caps, "NET_RAW")) {
		t.Errorf("DaemonSet is neither privileged nor given NET_ADMIN and NET_RAW: %v", caps)
	}
	if !mounts(spec, c, "/run/xtables.lock", func(v corev1.Volume) bool { return v.HostPath != nil && v.HostPath.Path == "/run/xtables.lock" }) {
		t.Error("DaemonSet does not mount the host's /run/xtables.lock")
	}
	// The API server's own address, not the kubelet's kubernetes Service
	// ClusterIP, which only this proxy programs (the API-server audit: a
	// fresh node or a restarted proxy could never reach it).
	env := map[string]string{}
	for _, e := range c.Env {
		env[e.Name] = e.Value
	}
	if env["KUBERNETES_SERVICE_HOST"] == "" || env["KUBERNETES_SERVICE_PORT"] == "" {
		t.Error("DaemonSet does not set KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT: in-cluster config would use the kubernetes Service's ClusterIP, which this proxy itself programs")
	}
	if sa := spec.ServiceAccountName; sa != rbac.account.Name || rbac.account.Namespace != ds.Namespace {
		t.Errorf("DaemonSet's service account %s/%s, rbac.yaml creates %s/%s", ds.Namespace, sa, rbac.account.Namespace, rbac.account.Name)
	}
	checkRole(t, rbac)

	// The flags in args are the binary's, and the ConfigMap is where --config reads.
	fs := pflag.NewFlagSet("lint", pflag.ContinueOnError)
	newOptions().addFlags(fs)
	var configPath string
	for _, a := range c.Args {
		name, value, _ := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		if !strings.HasPrefix(a, "--") || fs.Lookup(name) == nil {
			t.Errorf("DaemonSet arg %q is not a flag of kube-userspace-proxy", a)
		}
		if name == "config" {
			configPath = value
		}
	}
	dir, file := filepath.Split(configPath)
	if _, ok := cm.Data[file]; !ok || !mounts(spec, c, filepath.Clean(dir), func(v corev1.Volume) bool {
		return v.ConfigMap != nil && v.ConfigMap.Name == cm.Name
	}) {
		t.Fatalf("--config=%s is not the ConfigMap %s's key mounted there (keys %v)", configPath, cm.Name, keys(cm.Data))
	}

	// The binary accepts the configuration, and the probes ask its health port.
	conf := filepath.Join(t.TempDir(), file)
	if err := os.WriteFile(conf, []byte(cm.Data[file]), 0o644); err != nil {
		t.Fatal(err)
	}
	o := newOptions()
	fs = pflag.NewFlagSet("lint", pflag.ContinueOnError)
	o.addFlags(fs)
	if err := fs.Parse([]string{"--config=" + conf, "--manifests=" + t.TempDir()}); err != nil {
		t.Fatal(err)
	}
	if err := o.applyConfigFile(fs); err != nil {
		t.Fatalf("the ConfigMap's %s: %v", file, err)
	}
	if _, err := o.validate(); err != nil {
		t.Fatalf("the ConfigMap's %s: %v", file, err)
	}
	_, healthPort, _ := strings.Cut(o.healthzBindAddress, ":")
	for name, p := range map[string]*corev1.Probe{"liveness": c.LivenessProbe, "readiness": c.ReadinessProbe} {
		want := map[string]string{"liveness": "/livez", "readiness": "/healthz"}[name]
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Path != want || p.HTTPGet.Port.String() != healthPort {
			t.Errorf("%s probe %+v, want GET %s on the health port %s", name, p, want, healthPort)
		}
	}
}

func mounts(spec corev1.PodSpec, c corev1.Container, path string, volume func(corev1.Volume) bool) bool {
	for _, m := range c.VolumeMounts {
		if m.MountPath != path {
			continue
		}
		for _, v := range spec.Volumes {
			if v.Name == m.Name && volume(v) {
				return true
			}
		}
	}
	return false
}

func keys(m map[string]string) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

type deployRBAC struct {
	account corev1.ServiceAccount
	role    rbacv1.ClusterRole
	binding rbacv1.ClusterRoleBinding
}

// readDeploy decodes examples/deploy into the API types, strictly: a
// misspelt field is an error, as kubectl apply's server-side validation
// would make it.
func readDeploy(t *testing.T) (appsv1.DaemonSet, corev1.ConfigMap, deployRBAC) {
	t.Helper()
	var ds appsv1.DaemonSet
	var cm corev1.ConfigMap
	var rbac deployRBAC
	decode := func(file string, doc []byte, into any) {
		if err := yaml.UnmarshalStrict(doc, into); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
	}
	files, _ := filepath.Glob(filepath.Join(repoRoot, deployDir, "*.yaml"))
	seen := map[string]bool{}
	for _, f := range files {
		data, _ := os.ReadFile(f)
		for _, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(data), -1) {
			var meta struct{ Kind string }
			if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			switch meta.Kind {
			case "DaemonSet":
				decode(f, []byte(doc), &ds)
			case "ConfigMap":
				decode(f, []byte(doc), &cm)
			case "ServiceAccount":
				decode(f, []byte(doc), &rbac.account)
			case "ClusterRole":
				decode(f, []byte(doc), &rbac.role)
			case "ClusterRoleBinding":
				decode(f, []byte(doc), &rbac.binding)
			case "":
				if strings.TrimSpace(regexp.MustCompile(`(?m)^#.*$`).ReplaceAllString(doc, "")) != "" {
					t.Errorf("%s: a document without a kind", f)
				}
				continue
			default:
				t.Errorf("%s: unexpected kind %s", f, meta.Kind)
			}
			seen[meta.Kind] = true
		}
	}
	for _, k := range []string{"DaemonSet", "ConfigMap", "ServiceAccount", "ClusterRole", "ClusterRoleBinding"} {
		if !seen[k] {
			t.Fatalf("%s has no %s", deployDir, k)
		}
	}
	return ds, cm, rbac
}

// checkRole: the role grants what the proxy reads and writes, and the
// binding gives it to the DaemonSet's account.
func checkRole(t *testing.T, r deployRBAC) {
	t.Helper()
	allows := func(group, resource string, verbs ...string) bool {
		for _, rule := range r.role.Rules {
			if slices.Contains(rule.APIGroups, group) && slices.Contains(rule.Resources, resource) {
				ok := true
				for _, v := range verbs {
					ok = ok && slices.Contains(rule.Verbs, v)
				}
				if ok {
					return true
				}
			}
		}
		return false
	}
	for _, need := range []struct {
		group, resource string
		verbs           []string
	}{
		{"", "services", []string{"list", "watch"}},
		{"discovery.k8s.io", "endpointslices", []string{"list", "watch"}},
		{"", "nodes", []string{"get", "list", "watch"}},
		{"", "events", []string{"create", "patch"}},
	} {
		if !allows(need.group, need.resource, need.verbs...) {
			t.Errorf("ClusterRole %s does not allow %v on %s", r.role.Name, need.verbs, need.resource)
		}
	}
	b := r.binding
	if b.RoleRef.Kind != "ClusterRole" || b.RoleRef.Name != r.role.Name ||
		!slices.ContainsFunc(b.Subjects, func(s rbacv1.Subject) bool {
			return s.Kind == "ServiceAccount" && s.Name == r.account.Name && s.Namespace == r.account.Namespace
		}) {
		t.Errorf("ClusterRoleBinding %s does not bind %s to %s/%s", b.Name, r.role.Name, r.account.Namespace, r.account.Name)
	}
}

// sanity: the parser joins continuations and tracks stages.
func TestParseDockerfile(t *testing.T) {
	got := parseDockerfile(t, "FROM a AS build\n# c\nRUN x \\\n y\nFROM b\nCOPY --from=build /o /p\n")
	var ops []string
	for _, in := range got {
		ops = append(ops, in.op+"@"+in.stage+":"+strings.Join(in.args, " "))
	}
	want := []string{"FROM@build:a AS build", "RUN@build:x y", "FROM@:b", "COPY@:--from=build /o /p"}
	if !slices.Equal(ops, want) {
		t.Errorf("parsed %q, want %q", ops, want)
	}
}
