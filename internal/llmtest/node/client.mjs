// One call to an LLM API through its official SDK, for sluice's tests (internal/llmtest's
// RunClient). The call is argv[2], a JSON object:
//
//   sdk           "openai" or "anthropic"
//   api           openai: "chat" (default), "completions", "responses" or "embeddings";
//                 anthropic: "messages" (default)
//   base_url      the server's URL without /v1 (the openai SDK is given base_url + "/v1", as its
//                 own default ends in /v1; the anthropic SDK's does not)
//   api_key, model, max_tokens, stream (bool), include_usage (bool: an openai stream's
//   stream_options.include_usage), headers (object: sent with the request), max_retries,
//   timeout_ms
//
// It prints one JSON line: {ok, text, usage, vectors, status, error_type, error_code,
// error_message, attempts, statuses, gaps_ms}. text is the completion as the SDK assembled it,
// usage the usage as the SDK reports it (null when none), error_type the SDK's error class
// (RateLimitError…) and error_code the error's type or code from the body. attempts is the
// number of HTTP requests the SDK made (counted by the fetch it is given), statuses their
// statuses, gaps_ms the time from each attempt's start to the next one's.

const call = JSON.parse(process.argv[2] ?? '{}');
const starts = [];
const statuses = [];
const countingFetch = async (url, init) => {
  starts.push(performance.now());
  const resp = await fetch(url, init);
  statuses.push(resp.status);
  return resp;
};

const prompt = 'Say hello.';
const opts = { headers: call.headers ?? {} };
const common = {
  apiKey: call.api_key ?? 'test-key',
  maxRetries: call.max_retries ?? 0,
  timeout: call.timeout_ms ?? 30000,
  fetch: countingFetch,
};

// Each SDK is imported only when used: node starts faster.
async function openai() {
  const { default: OpenAI } = await import('openai');
  const client = new OpenAI({ ...common, baseURL: call.base_url + '/v1' });
  const model = call.model ?? 'gpt-test';
  const stream = !!call.stream;
  const streamOptions = stream && call.include_usage ? { stream_options: { include_usage: true } } : {};
  let text = '';
  let usage = null;
  switch (call.api ?? 'chat') {
    case 'chat': {
      const params = { model, messages: [{ role: 'user', content: prompt }], max_tokens: call.max_tokens, stream, ...streamOptions };
      const r = await client.chat.completions.create(params, opts);
      if (!stream) return { text: r.choices[0].message.content, usage: r.usage ?? null };
      for await (const chunk of r) {
        text += chunk.choices[0]?.delta?.content ?? '';
        if (chunk.usage) usage = chunk.usage;
      }
      return { text, usage };
    }
    case 'completions': {
      const r = await client.completions.create({ model, prompt, max_tokens: call.max_tokens, stream, ...streamOptions }, opts);
      if (!stream) return { text: r.choices[0].text, usage: r.usage ?? null };
      for await (const chunk of r) {
        text += chunk.choices[0]?.text ?? '';
        if (chunk.usage) usage = chunk.usage;
      }
      return { text, usage };
    }
    case 'responses': {
      const r = await client.responses.create({ model, input: prompt, max_output_tokens: call.max_tokens, stream }, opts);
      if (!stream) return { text: r.output_text, usage: r.usage ?? null };
      for await (const ev of r) {
        if (ev.type === 'response.output_text.delta') text += ev.delta;
        if (ev.type === 'response.completed') usage = ev.response.usage ?? null;
      }
      return { text, usage };
    }
    case 'embeddings': {
      const r = await client.embeddings.create({ model, input: [prompt, prompt] }, opts);
      return { text: '', usage: r.usage ?? null, vectors: r.data.map((d) => Array.from(d.embedding)) };
    }
  }
  throw new Error(`unknown openai api ${call.api}`);
}

async function anthropic() {
  const { default: Anthropic } = await import('@anthropic-ai/sdk');
  const client = new Anthropic({ ...common, baseURL: call.base_url });
  const params = { model: call.model ?? 'claude-test', max_tokens: call.max_tokens ?? 16, messages: [{ role: 'user', content: prompt }] };
  const msg = call.stream
    ? await client.messages.stream(params, opts).finalMessage()
    : await client.messages.create(params, opts);
  const text = msg.content.filter((b) => b.type === 'text').map((b) => b.text).join('');
  return { text, usage: msg.usage ?? null };
}

const out = { ok: false, text: '', usage: null, status: 0, error_type: '', error_code: '', error_message: '' };
try {
  Object.assign(out, call.sdk === 'anthropic' ? await anthropic() : call.sdk === 'openai' ? await openai() : {});
  out.ok = call.sdk === 'anthropic' || call.sdk === 'openai';
  if (!out.ok) out.error_message = `unknown sdk ${call.sdk}`;
} catch (err) {
  out.error_type = err?.constructor?.name ?? typeof err;
  out.error_message = String(err?.message ?? err);
  out.status = err?.status ?? 0;
  // openai: err.code / err.type from {"error": {...}}; anthropic: err.error is the whole body
  // {"type": "error", "error": {"type": ...}}.
  out.error_code = err?.code ?? err?.type ?? err?.error?.error?.type ?? err?.error?.type ?? '';
}
if (out.ok) out.status = statuses.at(-1) ?? 0;
out.attempts = starts.length;
out.statuses = statuses;
out.gaps_ms = starts.slice(1).map((s, i) => s - starts[i]);
process.stdout.write(JSON.stringify(out) + '\n');
