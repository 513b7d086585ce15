// reference.mjs renders and tokenizes the corpus with transformers.js, the reference the Go
// exactness test (exact_test.go) compares chattemplate + tokenizer against. Offline: tokenizers
// are built from local tokenizer.json + tokenizer_config.json, as AutoTokenizer would build them.
//
// Usage: node reference.mjs <chat|prompt> <corpus.json> <tokenizer dir>...
//
// Prints one JSON line per (tokenizer dir, case), in corpus order:
//   {"model": dir, "name": case name, "text": rendered (chat) or echoed (prompt) text,
//    "ids": token ids, "error": message if rendering threw}
// chat:   text = apply_chat_template(messages, {tools, add_generation_prompt, tokenize: false, ...kwargs}),
//         ids  = the same with tokenize: true (return_tensor and return_dict false).
// prompt: ids  = encode(text, {add_special_tokens}).
import * as transformers from "@huggingface/transformers";
import fs from "node:fs";
import path from "node:path";

const [family, corpusPath, ...dirs] = process.argv.slice(2);
if (!["chat", "prompt"].includes(family) || !corpusPath || dirs.length === 0) {
  console.error("usage: node reference.mjs <chat|prompt> <corpus.json> <tokenizer dir>...");
  process.exit(2);
}
const corpus = JSON.parse(fs.readFileSync(corpusPath, "utf8"));
const readJSON = (dir, file) => JSON.parse(fs.readFileSync(path.join(dir, file), "utf8"));

const out = [];
for (const dir of dirs) {
  const config = readJSON(dir, "tokenizer_config.json");
  const name = config.tokenizer_class?.replace(/Fast$/, "") ?? "PreTrainedTokenizer";
  const Tokenizer = transformers[name] ?? transformers.PreTrainedTokenizer;
  const tokenizer = new Tokenizer(readJSON(dir, "tokenizer.json"), config);
  for (const c of corpus[family]) {
    const row = { model: dir, name: c.name };
    try {
      if (family === "chat") {
        const opts = { tools: c.tools ?? null, add_generation_prompt: !!c.add_generation_prompt, ...(c.kwargs ?? {}) };
        row.text = tokenizer.apply_chat_template(c.messages, { ...opts, tokenize: false });
        row.ids = tokenizer.apply_chat_template(c.messages, {
          ...opts,
          tokenize: true,
          return_tensor: false,
          return_dict: false,
        });
      } else {
        row.text = c.text;
        row.ids = tokenizer.encode(c.text, { add_special_tokens: !!c.add_special_tokens });
      }
    } catch (e) {
      row.error = String(e?.message ?? e);
    }
    out.push(JSON.stringify(row) + "\n");
  }
}
process.stdout.write(out.join(""));
