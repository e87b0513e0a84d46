package redis

import (
	"context"
	"log/slog"
	"strings"

	"github.com/redis/rueidis"
)

// The store's calls as functions of the library (scripts.go, THE LIBRARY): FCALL, with the
// library loaded (FUNCTION LOAD REPLACE) at connection and again when a node does not have it.
//
// Whether to call functions is decided once, at connection: the store loads the library (on a
// cluster, on the node of slot 0; the others load it when a call first finds it missing). If
// the server refuses (a Redis before 7.0 has no FUNCTION: "unknown command"; an ACL user
// without +function|load or +fcall: NOPERM) the store runs the scripts instead (EVALSHA, EVAL)
// for as long as that connection lasts, and says so to the logger. Either way each call
// decides the same, with the same replies and errors: the functions are the scripts.

// doer is what calls go through: the client (auto-pipelined) or one dedicated connection.
type doer interface {
	Do(ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult
	B() rueidis.Builder
}

// fcall calls p's function on d with keys and args; if the node does not have the library, it
// loads it there (on the node of keys[0]'s slot) and calls again, once.
//
// One case sends the script instead: a Redis at maxmemory that may not evict (noeviction)
// refuses every FCALL of a function that may write, at once ("OOM"), while it runs a script
// (without flags) until it writes. So a refusal or a peek, which writes nothing, is still
// answered there, as by the scripts; an approval fails in both.
func fcall(ctx context.Context, d doer, p *program, keys, args []string) rueidis.RedisResult {
	res := d.Do(ctx, d.B().Fcall().Function(p.fn).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build())
	if re, ok := rueidis.IsRedisErr(res.Error()); ok && strings.HasPrefix(re.Error(), "OOM") {
		return evalsha(ctx, d, p, keys, args)
	}
	if !functionNotFound(res.Error()) {
		return res
	}
	if load := loadLibrary(ctx, d, keys[0]); load.Error() != nil {
		return load
	}
	return d.Do(ctx, d.B().Fcall().Function(p.fn).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build())
}

// loadLibrary loads the library on the node that serves key's slot (any node if d is not a
// cluster client). REPLACE: loading again what a node has (two callers that both found it
// missing) is no error.
func loadLibrary(ctx context.Context, d doer, key string) rueidis.RedisResult {
	return d.Do(ctx, d.B().FunctionLoad().Replace().FunctionCode(library.code).Build().SetSlot(key))
}

// functionNotFound reports whether err is Redis's answer to FCALL of a function it does not have.
func functionNotFound(err error) bool {
	re, ok := rueidis.IsRedisErr(err)
	return ok && strings.Contains(re.Error(), "Function not found")
}

// useFunctions loads the library at connection and reports whether the store is to call it: an
// error only if Redis did not answer; a refusal means scripts, logged.
func useFunctions(ctx context.Context, client rueidis.Client, log *slog.Logger) (bool, error) {
	err := loadLibrary(ctx, client, "").Error()
	if err == nil {
		return true, nil
	}
	re, ok := rueidis.IsRedisErr(err)
	if !ok {
		return false, err
	}
	log.Info("Redis does not take the store's function library (Redis Functions need Redis 7.0, and the ACL user +fcall and +function|load); running the same decisions as Lua scripts (EVALSHA)",
		"error", re.Error())
	return false, nil
}

// evalsha runs p's script on d with keys and args: EVALSHA, and EVAL after NOSCRIPT (Redis lost
// its scripts: a restart, a failover to a replica that never ran them).
func evalsha(ctx context.Context, d doer, p *program, keys, args []string) rueidis.RedisResult {
	res := d.Do(ctx, d.B().Evalsha().Sha1(p.sha1).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build())
	if re, isRedis := rueidis.IsRedisErr(res.Error()); isRedis && re.IsNoScript() {
		res = d.Do(ctx, d.B().Eval().Script(p.text).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build())
	}
	return res
}
