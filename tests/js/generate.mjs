// Loads a directory written by `hybridrt export SRC -o OUT --layout transformers-js` from the
// local filesystem with transformers.js and prints one JSON line.
//
//   node generate.mjs OUT --ids 1,5,7 --new 8           greedy tokens (ids given, no tokenizer)
//   node generate.mjs OUT --rows "1,5,7;1,8" --new 8    greedy tokens of a batch, shorter rows
//                                                       left-padded with pad_token_id, their mask
//                                                       0 there (a tokenizer's padding_side
//                                                       "left"); {"error": message} if it throws
//   node generate.mjs OUT --prefill 512 [--repeat 3]    prefill times: one call vs token by token,
//                                                       and the last logits of both ways compared
//   --dtype fp32|q4|q8|int8                             the file transformers.js loads (default
//                                                       fp32: onnx/model.onnx; q4: model_q4.onnx, ...)
import path from 'node:path';
import { parseArgs } from 'node:util';
import { AutoModelForCausalLM, Tensor, env } from '@huggingface/transformers';

const { values, positionals } = parseArgs({
    allowPositionals: true,
    options: {
        ids: { type: 'string' },
        rows: { type: 'string' },
        new: { type: 'string', default: '8' },
        prefill: { type: 'string' },
        repeat: { type: 'string', default: '3' },
        dtype: { type: 'string', default: 'fp32' },
    },
});
const dir = path.resolve(positionals[0]);
env.allowRemoteModels = false;
env.allowLocalModels = true;
env.localModelPath = path.dirname(dir) + path.sep;

const model = await AutoModelForCausalLM.from_pretrained(path.basename(dir), { dtype: values.dtype, device: 'cpu' });
const row = (ids) => new Tensor('int64', BigInt64Array.from(ids.map(BigInt)), [1, ids.length]);
const ones = (n) => new Tensor('int64', new BigInt64Array(n).fill(1n), [1, n]);
const keepOne = () => new Tensor('int64', BigInt64Array.from([1n]), []);

// Both modes in one run print one line with both reports (one Node start per directory).
const report = {};
if (values.ids) {
    const ids = values.ids.split(',').map(Number);
    const n = Number(values.new);
    // Greedy, no repetition penalty; min_new_tokens keeps EOS from ending the run early.
    const out = await model.generate({
        input_ids: row(ids),
        attention_mask: ones(ids.length),
        max_new_tokens: n,
        min_new_tokens: n,
        do_sample: false,
        repetition_penalty: 1.0,
    });
    report.tokens = Array.from(out.data, Number).slice(ids.length);
}
if (values.rows) {
    const rows = values.rows.split(';').map((r) => r.split(',').map(Number));
    const width = Math.max(...rows.map((r) => r.length));
    const pad = model.config.pad_token_id ?? 0;
    const padded = rows.flatMap((r) => [...Array(width - r.length).fill(pad), ...r]);
    const mask = rows.flatMap((r) => [...Array(width - r.length).fill(0), ...Array(r.length).fill(1)]);
    const batch = (xs) => new Tensor('int64', BigInt64Array.from(xs.map(BigInt)), [rows.length, width]);
    const n = Number(values.new);
    try {
        const out = await model.generate({
            input_ids: batch(padded),
            attention_mask: batch(mask),
            max_new_tokens: n,
            min_new_tokens: n,
            do_sample: false,
            repetition_penalty: 1.0,
        });
        const all = Array.from(out.data, Number);
        report.rows = rows.map((_, i) => all.slice(i * (width + n) + width, (i + 1) * (width + n)));
    } catch (e) {
        report.error = String(e?.message ?? e);
    }
}
if (values.prefill) Object.assign(report, await prefillTimes(Number(values.prefill), Number(values.repeat)));
console.log(JSON.stringify(report));

// The present outputs renamed as the next call's pasts (transformers.js's getPastKeyValues).
function nextPast(outputs) {
    const past = {};
    for (const [name, t] of Object.entries(outputs)) {
        if (name.startsWith('present_')) past[name.replace('present_', 'past_')] = t;
        else if (name.startsWith('present.')) past[name.replace('present.', 'past_key_values.')] = t;
    }
    return past;
}

async function prefillTimes(length, repeat) {
    // a config with the language model under text_config (Qwen3.5 MoE) has its vocab_size there
    const vocab = model.config.vocab_size ?? model.config.text_config.vocab_size;
    const ids = Array.from({ length }, (_, i) => 3 + ((i * 7919) % (vocab - 3)));
    const oneCall = async () => {
        const out = await model({ input_ids: row(ids), attention_mask: ones(length), num_logits_to_keep: keepOne() });
        return out.logits.data.slice(-vocab);
    };
    const byToken = async () => {
        let past = null;
        let out;
        for (let t = 0; t < length; ++t) {
            out = await model({
                input_ids: row([ids[t]]),
                attention_mask: ones(t + 1),
                num_logits_to_keep: keepOne(),
                ...(past ? { past_key_values: past } : {}),
            });
            past = nextPast(out);
        }
        return out.logits.data.slice(-vocab);
    };
    const time = async (fn) => {
        await fn(); // warm-up
        const ms = [];
        let last;
        for (let r = 0; r < repeat; ++r) {
            const t0 = performance.now();
            last = await fn();
            ms.push(performance.now() - t0);
        }
        ms.sort((a, b) => a - b);
        return { median_ms: ms[Math.floor(ms.length / 2)], last };
    };
    const a = await time(oneCall);
    const b = await time(byToken);
    let maxDiff = 0;
    for (let i = 0; i < vocab; ++i) maxDiff = Math.max(maxDiff, Math.abs(a.last[i] - b.last[i]));
    return {
        prompt_tokens: length,
        one_call_ms: a.median_ms,
        token_by_token_ms: b.median_ms,
        speedup: b.median_ms / a.median_ms,
        max_abs_last_logits: maxDiff,
    };
}
