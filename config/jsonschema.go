package config

import (
	"encoding/json"
)

// This file declares the configuration's shape once: every mapping with its fields, in the order
// docs/config.md lists them, and each field's kind. The parser's unknown-field checks take their
// field names from it (config/schema.go), and JSONSchema renders it as a JSON Schema, which the
// Helm chart's values.schema.json embeds: a field the parser reads but this schema lacks is an
// unknown field to the parser too, so the two cannot drift apart.
//
// The kinds are what the parser accepts, not narrower: a string field takes numbers and booleans
// as written (str), a duration is a string ("1s") or a bare 0, and a field the parser reads in
// several forms (a limit as a number or "$5") is left open to any scalar. Every field may be
// null, which the parser takes as absent. Ranges, patterns and the rules between fields stay the
// parser's: the schema catches unknown and misspelt fields, wrong shapes and enumerated values.

// schemaKind is what a schema node accepts.
type schemaKind int

const (
	kScalar       schemaKind = iota // a string, number or boolean
	kInt                            // an integer
	kNumber                         // a number
	kBool                           // true or false
	kDuration                       // a Go duration ("1s", "1h30m") or a bare 0
	kEnum                           // one of enum's strings
	kObject                         // a mapping of fields, no other
	kList                           // a list of items
	kMap                            // a mapping of any keys to items
	kNames                          // a name, or a list of names
	kAnyOf                          // any of anyOf
	kScalarOrList                   // a scalar, or a list of scalars
)

// schemaNode is one node of the configuration's schema.
type schemaNode struct {
	kind   schemaKind
	fields []schemaField  // kObject, in docs order
	items  *schemaNode    // kList, kMap
	enum   []string       // kEnum
	anyOf  []*schemaNode  // kAnyOf
	ref    string         // if set: rendered once under definitions, referred to by $ref
	extra  map[string]any // more JSON Schema keywords for this node (the top level's x- fields)
}

type schemaField struct {
	name string
	node *schemaNode
}

// names returns an object node's field names in order.
func (n *schemaNode) names() []string {
	out := make([]string, len(n.fields))
	for i, f := range n.fields {
		out[i] = f.name
	}
	return out
}

func object(fields ...schemaField) *schemaNode { return &schemaNode{kind: kObject, fields: fields} }
func field(name string, n *schemaNode) schemaField {
	return schemaField{name, n}
}
func listOf(n *schemaNode) *schemaNode            { return &schemaNode{kind: kList, items: n} }
func mapOf(n *schemaNode) *schemaNode             { return &schemaNode{kind: kMap, items: n} }
func oneOf(n ...*schemaNode) *schemaNode          { return &schemaNode{kind: kAnyOf, anyOf: n} }
func enum(values ...string) *schemaNode           { return &schemaNode{kind: kEnum, enum: values} }
func named(ref string, n *schemaNode) *schemaNode { n.ref = ref; return n }

var (
	scalar       = &schemaNode{kind: kScalar}
	integer      = &schemaNode{kind: kInt}
	number       = &schemaNode{kind: kNumber}
	boolean      = &schemaNode{kind: kBool}
	duration     = &schemaNode{kind: kDuration}
	names        = &schemaNode{kind: kNames}
	scalarOrList = &schemaNode{kind: kScalarOrList}
)

// The configuration's schema, section by section.
var (
	tlsSchema      = object(field("cert_file", scalar), field("key_file", scalar))
	adminTLSSchema = named("adminTLS", object(field("cert_file", scalar), field("key_file", scalar), field("client_ca_file", scalar)))
	sentinelSchema = object(field("master", scalar), field("addrs", listOf(scalar)), field("username", scalar), field("password", scalar), field("password_env", scalar))
	storeSchema    = named("store", object(
		field("type", enum(StoreMemory, StoreRedis)), field("addrs", listOf(scalar)), field("url", scalar), field("username", scalar),
		field("password", scalar), field("password_env", scalar), field("prefix", scalar), field("timeout", duration),
		field("slow_timeout", duration), field("on_error", enum("fail-open", "fail-closed", "local")), field("local_share", scalar),
		field("fleet", scalar), field("max_keys", integer), field("refusal_cache", integer), field("sentinel", sentinelSchema),
		field("replicas_ack", integer), field("replicas_ack_timeout", duration), field("settle_retry_for", duration)))
	regionSchema = object(field("name", scalar), field("global", storeSchema), field("regions", integer), field("refresh", duration),
		field("lease", duration), field("hold", duration), field("floor", number), field("safe_share", number), field("algorithm", scalar))

	apiKeySchema = object(field("header", scalar))
	jwtSchema    = object(field("header", scalar), field("algorithms", listOf(enum(jwtAlgorithms...))), field("secret_env", scalar),
		field("public_key_file", scalar), field("claim", scalar), field("issuer", scalar), field("audience", scalar), field("leeway", duration))
	ipSchema = object(field("trusted_proxies", listOf(scalar)), field("ipv4_prefix", integer), field("ipv6_prefix", integer),
		field("forwarded_header", scalar))
	identitySchema = object(field("api_key", apiKeySchema), field("jwt", jwtSchema), field("ip", ipSchema))

	budgetSchema = object(field("size", integer), field("max_age", duration))
	keyBySchema  = object(field("header", scalar), field("query", scalar), field("path_prefix", scalar), field("jwt_claim", scalar),
		field("json_body", scalar), field("shared", boolean), field("client", scalar), field("path", scalar), field("method", scalar),
		field("remote_address", scalar))
	policySchema = object(field("name", scalar),
		field("algorithm", enum("fixed-window", "sliding-log", "sliding-window", "token-bucket", "leaky-bucket", "concurrency")),
		field("limit", scalar), field("period", duration), field("burst", integer), field("dry_run", boolean),
		field("key_by", listOf(oneOf(scalar, keyBySchema))), field("local_budget", budgetSchema), field("calendar", enum("day", "week", "month", "year")),
		field("time_zone", scalar), field("lease", duration), field("counts", enum("requests", "tokens", "usd")), field("global", boolean))

	orgSchema    = object(field("name", scalar), field("policy", names))
	teamSchema   = object(field("name", scalar), field("organisation", scalar), field("policy", names))
	clientSchema = object(field("name", scalar), field("api_key_sha256", scalarOrList), field("jwt_subject", scalar), field("policy", names),
		field("team", scalar), field("organisation", scalar))

	costFromSchema  = object(field("header", scalar))
	countOnlySchema = object(field("status", listOf(scalar)))
	weightsSchema   = object(field("input", scalar), field("cached_input", scalar), field("output", scalar))
	estimateSchema  = object(field("bytes_per_token", integer), field("default_output", integer), field("media_tokens", integer), field("max", integer))
	usageSchema     = object(field("format", scalar), field("field", scalar), field("count", scalar), field("weights", weightsSchema),
		field("estimate", estimateSchema), field("max_body", integer), field("inject_usage", boolean), field("no_usage", enum("estimate", "refund")),
		field("errors", scalar))
	routeSchema = object(field("method", scalar), field("path_prefix", scalar), field("cost", scalar), field("policy", names), field("scope", scalar),
		field("cost_from", costFromSchema), field("count_only", countOnlySchema), field("refund_on", listOf(scalar)), field("priority", scalar),
		field("usage", usageSchema))
	priceSchema = object(field("input", scalar), field("cached_input", scalar), field("output", scalar))
	modelSchema = object(field("name", scalar), field("price", priceSchema), field("policy", names))

	limitsSchema = object(field("max_delay", duration), field("legacy_headers", boolean))
	serverSchema = object(field("body_timeout", duration), field("body_min_rate", integer), field("body_memory", integer),
		field("drain_timeout", duration), field("shutdown_delay", duration))

	xdsTLSSchema = object(field("ca_file", scalar), field("cert_file", scalar), field("key_file", scalar), field("server_name", scalar))
	retrySchema  = object(field("initial", duration), field("max", duration))
	xdsSchema    = object(field("server", scalar), field("node_id", scalar), field("node_metadata", mapOf(scalar)), field("tls", xdsTLSSchema),
		field("connect_retry", retrySchema))
	quotaBucketSchema = object(field("name", scalar), field("match", mapOf(scalar)), field("blanket", enum("allow", "deny")), field("limit", integer),
		field("period", duration), field("burst", integer))
	quotaSchema = named("quota", object(field("domain", scalar), field("report_interval", duration), field("assignment_ttl", duration), field("idle", duration),
		field("algorithm", scalar), field("buckets", listOf(quotaBucketSchema))))
	rlsSchema = object(field("listen", scalar), field("envoy_config", listOf(scalar)), field("xds", xdsSchema), field("tls", adminTLSSchema),
		field("quota", quotaSchema))

	forwardAuthSchema = object(field("refused_status", integer))
	accessSchema      = object(field("sample", number), field("per_second", number))
	logSchema         = object(field("format", enum(LogText, LogJSON)), field("level", scalar), field("access", oneOf(boolean, accessSchema)))
	tokenSchema       = object(field("name", scalar), field("token_env", scalar))
	adminSchema       = object(field("token_env", scalar), field("tokens", listOf(tokenSchema)), field("metrics_listen", scalar),
		field("tls", adminTLSSchema), field("clients_file", scalar), field("clients_poll", duration))
	tracingSchema      = object(field("otlp_endpoint", scalar), field("otlp_protocol", scalar), field("sample", number), field("service_name", scalar))
	loadSheddingSchema = object(field("min_limit", integer), field("max_limit", integer), field("window", duration), field("baseline_window", duration),
		field("tolerance", number), field("slack", duration), field("retry_after", duration), field("default_priority", scalar),
		field("priorities", mapOf(scalar)))

	// configSchema is the whole file. Top-level fields starting with x- are the file's own (a
	// place for YAML anchors).
	configSchema = &schemaNode{kind: kObject, fields: []schemaField{
		field("listen", scalar), field("admin_listen", scalar), field("upstream", scalar), field("tls", tlsSchema), field("store", storeSchema),
		field("region", regionSchema), field("identity", listOf(identitySchema)), field("policies", listOf(policySchema)),
		field("default_policy", names), field("organisations", listOf(orgSchema)), field("teams", listOf(teamSchema)),
		field("clients", listOf(clientSchema)), field("routes", listOf(routeSchema)), field("models", listOf(modelSchema)),
		field("limits", limitsSchema), field("server", serverSchema), field("rls", rlsSchema), field("forward_auth", forwardAuthSchema),
		field("log", logSchema), field("admin", adminSchema), field("tracing", tracingSchema), field("load_shedding", loadSheddingSchema)},
		extra: map[string]any{"patternProperties": map[string]any{"^x-": map[string]any{}}}}
)

// JSONSchema returns the configuration's JSON Schema (draft-07), with the shared parts under
// "definitions": every mapping allows only its own fields (at the top level also x-...).
// JSON Schema sees the file as data, so YAML anchors and merges must be resolved first (any
// YAML-to-JSON conversion does). What it accepts, Parse may still refuse (ranges, references,
// fields that exclude each other); what it refuses, Parse refuses too.
func JSONSchema() []byte {
	defs := map[string]any{}
	top := RenderSchema(defs, "#/definitions/")
	top["$schema"] = "http://json-schema.org/draft-07/schema#"
	top["$id"] = "https://github.com/sluicehq/sluice/config.schema.json"
	top["title"] = "sluice configuration"
	top["description"] = "sluice's configuration file (docs/config.md)"
	top["definitions"] = defs
	b, err := json.MarshalIndent(top, "", "  ")
	if err != nil {
		panic(err) // maps of strings, slices and booleans: cannot fail
	}
	return append(b, '\n')
}

// RenderSchema returns the configuration's schema as JSON Schema, for a document that embeds it
// (the chart's values schema): the shared parts go into defs, referred to as prefix + name
// (e.g. "#/definitions/store").
func RenderSchema(defs map[string]any, prefix string) map[string]any {
	return configSchema.render(defs, prefix)
}

// nullable adds null to a type: the parser takes a null field as absent.
func nullable(types ...string) map[string]any { return map[string]any{"type": append(types, "null")} }

// render returns n as JSON Schema; named nodes go into defs once and are referred to.
func (n *schemaNode) render(defs map[string]any, prefix string) map[string]any {
	if n.ref != "" {
		if _, ok := defs[n.ref]; !ok {
			defs[n.ref] = true // placeholder: a node that contains itself stops here
			defs[n.ref] = n.renderSelf(defs, prefix)
		}
		return map[string]any{"$ref": prefix + n.ref}
	}
	return n.renderSelf(defs, prefix)
}

func (n *schemaNode) renderSelf(defs map[string]any, prefix string) map[string]any {
	switch n.kind {
	case kScalar:
		return nullable("string", "number", "boolean")
	case kInt:
		return nullable("integer")
	case kNumber:
		return nullable("number")
	case kBool:
		return nullable("boolean")
	case kDuration:
		s := nullable("string", "integer")
		s["description"] = "a duration: 50ms, 1s, 1m, 1h30m (or 0)"
		return s
	case kEnum:
		e := make([]any, 0, len(n.enum)+1)
		for _, v := range n.enum {
			e = append(e, v)
		}
		return map[string]any{"enum": append(e, nil)}
	case kNames:
		return map[string]any{"anyOf": []any{
			nullable("string", "number", "boolean"),
			map[string]any{"type": "array", "items": map[string]any{"type": []string{"string", "number", "boolean"}}},
		}}
	case kScalarOrList:
		return map[string]any{"anyOf": []any{
			nullable("string", "number", "boolean"),
			map[string]any{"type": "array", "items": map[string]any{"type": []string{"string", "number", "boolean"}}},
		}}
	case kList:
		return map[string]any{"type": []string{"array", "null"}, "items": n.items.render(defs, prefix)}
	case kMap:
		return map[string]any{"type": []string{"object", "null"}, "additionalProperties": n.items.render(defs, prefix)}
	case kAnyOf:
		alts := make([]any, len(n.anyOf))
		for i, a := range n.anyOf {
			alts[i] = a.render(defs, prefix)
		}
		return map[string]any{"anyOf": alts}
	case kObject:
		props := map[string]any{}
		for _, f := range n.fields {
			props[f.name] = f.node.render(defs, prefix)
		}
		s := map[string]any{"type": []string{"object", "null"}, "properties": props, "additionalProperties": false}
		for k, v := range n.extra {
			s[k] = v
		}
		return s
	}
	panic("config: unknown schema kind")
}
