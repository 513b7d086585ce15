// reference.mjs tokenizes with transformers.js, the ids reference the Go exactness test
// (exact_test.go) compares dataplane/render/tokenizer against. Offline: tokenizers are built from
// local tokenizer.json + tokenizer_config.json, as AutoTokenizer would build them.
//
// Usage:
//   node reference.mjs prompt <corpus.json> <tokenizer dir>...
//     ids = encode(case.text, {add_special_tokens: case.add_special_tokens}) for every prompt case.
//   node reference.mjs encode <texts.json>
//     texts.json is {"<tokenizer dir>": [{"name": ..., "text": ...}, ...], ...}: the chat
//     templates' texts as Python's Jinja2 rendered them (reference.py);
//     ids = encode(text, {add_special_tokens: false}), as apply_chat_template(tokenize=true) does.
//
// Prints one JSON line per (tokenizer dir, case), in input order:
//   {"model": dir, "name": case name, "text": the text encoded, "ids": token ids,
//    "error": message if the tokenizer threw}
import * as transformers from "@huggingface/transformers";
import fs from "node:fs";
import path from "node:path";

const [mode, input, ...dirs] = process.argv.slice(2);
if (!(mode === "prompt" && input && dirs.length > 0) && !(mode === "encode" && input && dirs.length === 0)) {
  console.error("usage: node reference.mjs prompt <corpus.json> <tokenizer dir>... | node reference.mjs encode <texts.json>");
  process.exit(2);
}
const readJSON = (file) => JSON.parse(fs.readFileSync(file, "utf8"));

function load(dir) {
  const config = readJSON(path.join(dir, "tokenizer_config.json"));
  const name = config.tokenizer_class?.replace(/Fast$/, "") ?? "PreTrainedTokenizer";
  const Tokenizer = transformers[name] ?? transformers.PreTrainedTokenizer;
  return new Tokenizer(readJSON(path.join(dir, "tokenizer.json")), config);
}

// work lists, per tokenizer dir, the cases to encode: {name, text, add_special_tokens}.
const work = {};
if (mode === "prompt") {
  const corpus = readJSON(input);
  for (const dir of dirs) work[dir] = corpus.prompt;
} else {
  Object.assign(work, readJSON(input));
}

const out = [];
for (const [dir, cases] of Object.entries(work)) {
  const tokenizer = load(dir);
  for (const c of cases) {
    const row = { model: dir, name: c.name, text: c.text };
    try {
      row.ids = tokenizer.encode(c.text, { add_special_tokens: !!c.add_special_tokens });
    } catch (e) {
      row.error = String(e?.message ?? e);
    }
    out.push(JSON.stringify(row) + "\n");
  }
}
process.stdout.write(out.join(""));
