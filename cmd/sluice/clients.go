package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/sluicehq/sluice/config"
)

// The clients command's environment.
const (
	envAdminURL   = "SLUICE_ADMIN_URL"   // the admin listener (--admin)
	envAdminToken = "SLUICE_ADMIN_TOKEN" // its token (--token-env names another variable)
)

// clientsCmd is what every clients subcommand shares: where the admin listener is, its token.
type clientsCmd struct {
	admin    string
	tokenEnv string
	client   *http.Client
}

func newClientsCommand() *cobra.Command {
	c := &clientsCmd{client: &http.Client{Timeout: 10 * time.Second}}
	cmd := &cobra.Command{
		Use:   "clients list|get|put|delete|key|audit",
		Short: "manage clients, plans and overrides of running instances through the clients API",
		Long: `Manage the clients of running sluice instances through the clients API on their admin listener
(docs/gateway.md, "Manage clients at runtime"). With a Redis store every instance on it runs a change
within a second; with the memory store, the instance asked.

The admin listener is --admin (default $` + envAdminURL + `, else http://` + config.DefaultAdminListen + `); the token,
which writes need, is read from the environment variable --token-env names (default ` + envAdminToken + `),
never from the command line.

  sluice clients list [--prefix P] [--plan P] [--team T] [--organisation O] [--policy P]
  sluice clients get NAME
  sluice clients put NAME --api-key-sha256 HEX --policy standard [--override standard.limit=8] ...
  sluice clients put NAME --file client.json        (the API's JSON body; - reads standard input)
  sluice clients delete NAME
  sluice clients key NAME [--overlap 24h]           (a new key, shown once; --overlap rotates)
  sluice clients audit [--limit N]

put and delete take --if-match ETAG: the write is refused (412) if the client changed since.
Exit codes: 0 done, 1 the instance could not be reached or failed, 2 a bad command or a refused write.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error { return cmd.Help() },
	}
	cmd.PersistentFlags().StringVar(&c.admin, "admin", "", "the admin listener's `URL` (default $"+envAdminURL+", else http://"+config.DefaultAdminListen+")")
	cmd.PersistentFlags().StringVar(&c.tokenEnv, "token-env", envAdminToken, "the environment `VARIABLE` holding the admin token")

	list := &cobra.Command{Use: "list", Short: "list the API's clients (name order, every page)", Args: cobra.NoArgs}
	filters := map[string]*string{}
	for _, f := range []string{"prefix", "plan", "team", "organisation", "policy"} {
		filters[f] = list.Flags().String(f, "", "only clients with this "+f)
	}
	list.RunE = func(cmd *cobra.Command, args []string) error {
		q := url.Values{}
		for f, v := range filters {
			if *v != "" {
				q.Set(f, *v)
			}
		}
		q.Set("limit", "1000")
		var all []json.RawMessage
		for {
			var page struct {
				Clients []json.RawMessage `json:"clients"`
				Next    string            `json:"next"`
			}
			if err := c.do("GET", "/v1/clients?"+q.Encode(), nil, "", &page); err != nil {
				return err
			}
			all = append(all, page.Clients...)
			if page.Next == "" {
				break
			}
			q.Set("after", page.Next)
		}
		return printJSON(cmd.OutOrStdout(), map[string]any{"clients": all})
	}

	get := &cobra.Command{Use: "get NAME", Short: "show one client, with its revision", Args: cobra.ExactArgs(1)}
	get.RunE = func(cmd *cobra.Command, args []string) error {
		var out json.RawMessage
		if err := c.do("GET", "/v1/clients/"+url.PathEscape(args[0]), nil, "", &out); err != nil {
			return err
		}
		return printJSON(cmd.OutOrStdout(), out)
	}

	put := &cobra.Command{Use: "put NAME", Short: "create or replace a client", Args: cobra.ExactArgs(1)}
	var file, plan, team, org, subject, expires, ifMatch string
	var hashes, policies, overrides, meta []string
	put.Flags().StringVar(&file, "file", "", "the JSON body `FILE` (- for standard input) instead of the flags below")
	put.Flags().StringSliceVar(&hashes, "api-key-sha256", nil, "the SHA-256 (hex) of a key of the client (repeat for several)")
	put.Flags().StringVar(&subject, "jwt-subject", "", "the jwt source's claim value that names the client")
	put.Flags().StringSliceVar(&policies, "policy", nil, "a policy of the client (repeat for several)")
	put.Flags().StringVar(&plan, "plan", "", "the plan the client takes (its policies and overrides)")
	put.Flags().StringVar(&team, "team", "", "the client's team")
	put.Flags().StringVar(&org, "organisation", "", "the client's organisation")
	put.Flags().StringSliceVar(&overrides, "override", nil, "POLICY.FIELD=VALUE: the client's own limit, burst or period of a policy (standard.limit=8)")
	put.Flags().StringSliceVar(&meta, "meta", nil, "KEY=VALUE metadata")
	put.Flags().StringVar(&expires, "expires", "", "when the client stops being known (RFC 3339)")
	put.Flags().StringVar(&ifMatch, "if-match", "", "write only if the client's ETag is still this")
	put.RunE = func(cmd *cobra.Command, args []string) error {
		var body []byte
		var err error
		if file != "" {
			if cmd.Flags().NFlag() > 1+btoi(ifMatch != "")+btoi(cmd.Flags().Changed("admin"))+btoi(cmd.Flags().Changed("token-env")) {
				return fmt.Errorf("clients put: --file is the whole body; give the client's fields in it, not as flags too")
			}
			if file == "-" {
				body, err = io.ReadAll(io.LimitReader(cmd.InOrStdin(), 1<<20))
			} else {
				body, err = os.ReadFile(file)
			}
			if err != nil {
				return fmt.Errorf("clients put: %w", err)
			}
		} else if body, err = clientBody(hashes, subject, policies, plan, team, org, overrides, meta, expires); err != nil {
			return err
		}
		var out json.RawMessage
		if err := c.do("PUT", "/v1/clients/"+url.PathEscape(args[0]), body, ifMatch, &out); err != nil {
			return err
		}
		return printJSON(cmd.OutOrStdout(), out)
	}

	del := &cobra.Command{Use: "delete NAME", Short: "delete a client: its keys are anonymous from then on", Args: cobra.ExactArgs(1)}
	var delIfMatch string
	del.Flags().StringVar(&delIfMatch, "if-match", "", "delete only if the client's ETag is still this")
	del.RunE = func(cmd *cobra.Command, args []string) error {
		if err := c.do("DELETE", "/v1/clients/"+url.PathEscape(args[0]), nil, delIfMatch, nil); err != nil {
			return err
		}
		_, err := fmt.Fprintf(cmd.OutOrStdout(), "client %q deleted\n", args[0])
		return err
	}

	key := &cobra.Command{Use: "key NAME", Short: "generate a key for a client, shown once (--overlap rotates)", Args: cobra.ExactArgs(1)}
	var overlap string
	key.Flags().StringVar(&overlap, "overlap", "", "rotate: the client's other keys stay valid this long (e.g. 24h), then expire")
	key.RunE = func(cmd *cobra.Command, args []string) error {
		body := []byte("{}")
		if overlap != "" {
			body, _ = json.Marshal(map[string]string{"overlap": overlap})
		}
		var out json.RawMessage
		if err := c.do("POST", "/v1/clients/"+url.PathEscape(args[0])+"/keys", body, "", &out); err != nil {
			return err
		}
		return printJSON(cmd.OutOrStdout(), out)
	}

	audit := &cobra.Command{Use: "audit", Short: "show the audit trail, newest first", Args: cobra.NoArgs}
	limit := audit.Flags().Int("limit", 20, "how many entries (1 to 1000)")
	audit.RunE = func(cmd *cobra.Command, args []string) error {
		var out json.RawMessage
		if err := c.do("GET", "/v1/audit?limit="+strconv.Itoa(*limit), nil, "", &out); err != nil {
			return err
		}
		return printJSON(cmd.OutOrStdout(), out)
	}
	cmd.AddCommand(list, get, put, del, key, audit)
	return cmd
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// clientBody is put's JSON body made from its flags.
func clientBody(hashes []string, subject string, policies []string, plan, team, org string, overrides, meta []string, expires string) ([]byte, error) {
	b := map[string]any{}
	if len(hashes) > 0 {
		b["api_key_sha256"] = hashes
	}
	if subject != "" {
		b["jwt_subject"] = subject
	}
	if len(policies) > 0 {
		b["policy"] = policies
	}
	for k, v := range map[string]string{"plan": plan, "team": team, "organisation": org, "expires_at": expires} {
		if v != "" {
			b[k] = v
		}
	}
	if len(overrides) > 0 {
		o := map[string]map[string]any{}
		for _, s := range overrides {
			lhs, val, ok := strings.Cut(s, "=")
			pol, field, ok2 := strings.Cut(lhs, ".")
			if !ok || !ok2 || pol == "" {
				return nil, fmt.Errorf("clients put: --override %q: want POLICY.FIELD=VALUE (standard.limit=8)", s)
			}
			if o[pol] == nil {
				o[pol] = map[string]any{}
			}
			switch field {
			case "limit", "burst":
				n, err := strconv.ParseInt(val, 10, 64)
				if err != nil {
					return nil, fmt.Errorf("clients put: --override %q: %s must be an integer", s, field)
				}
				o[pol][field] = n
			case "period":
				o[pol][field] = val
			default:
				return nil, fmt.Errorf("clients put: --override %q: the field is limit, burst or period, not %q", s, field)
			}
		}
		b["overrides"] = o
	}
	if len(meta) > 0 {
		m := map[string]string{}
		for _, s := range meta {
			k, v, ok := strings.Cut(s, "=")
			if !ok {
				return nil, fmt.Errorf("clients put: --meta %q: want KEY=VALUE", s)
			}
			m[k] = v
		}
		b["metadata"] = m
	}
	return json.Marshal(b)
}

// do sends method path (with body as JSON) to the admin listener with the token, if the
// variable holds one, and decodes a 2xx answer into out (if not nil). A problem answer is an
// error with its detail: 4xx the user's (exit 2), else a failure (exit 1).
func (c *clientsCmd) do(method, path string, body []byte, ifMatch string, out any) error {
	base := c.admin
	if base == "" {
		base = os.Getenv(envAdminURL)
	}
	if base == "" {
		base = "http://" + config.DefaultAdminListen
	}
	if !strings.Contains(base, "://") {
		base = "http://" + base
	}
	req, err := http.NewRequest(method, strings.TrimSuffix(base, "/")+path, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("clients: --admin %q: %w", base, err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if tok := os.Getenv(c.tokenEnv); tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	if ifMatch != "" {
		if !strings.HasPrefix(ifMatch, `"`) {
			ifMatch = `"` + ifMatch + `"`
		}
		req.Header.Set("If-Match", ifMatch)
	}
	resp, err := c.client.Do(req)
	if err != nil {
		return failure{fmt.Errorf("clients: the admin listener %s did not answer: %w", base, err)}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return failure{fmt.Errorf("clients: %s %s: %w", method, path, err)}
	}
	if resp.StatusCode/100 != 2 {
		var p struct{ Detail string }
		detail := strings.TrimSpace(string(b))
		if json.Unmarshal(b, &p) == nil && p.Detail != "" {
			detail = p.Detail
		}
		err := fmt.Errorf("clients: %s %s: %s: %s", method, path, resp.Status, detail)
		if resp.StatusCode/100 == 4 {
			return err
		}
		return failure{err}
	}
	if out == nil || len(b) == 0 {
		return nil
	}
	if err := json.Unmarshal(b, out); err != nil {
		return failure{fmt.Errorf("clients: %s %s: the answer is not JSON: %w", method, path, err)}
	}
	if raw, ok := out.(*json.RawMessage); ok && resp.Header.Get("ETag") != "" {
		var m map[string]any
		if json.Unmarshal(*raw, &m) == nil {
			m["etag"] = resp.Header.Get("ETag")
			*raw, _ = json.Marshal(m)
		}
	}
	return nil
}

func printJSON(w io.Writer, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return failure{err}
	}
	if _, err := fmt.Fprintf(w, "%s\n", b); err != nil {
		return failure{err}
	}
	return nil
}
