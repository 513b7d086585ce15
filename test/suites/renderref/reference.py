#!/usr/bin/env python3
"""reference.py renders the chat corpus with Python's Jinja2 exactly as Hugging Face transformers'
apply_chat_template does: the text reference of the exactness test (exact_test.go).

It replicates transformers' _compile_jinja_template and render_jinja_template
(src/transformers/utils/chat_template_utils.py): an ImmutableSandboxedEnvironment with
trim_blocks, lstrip_blocks, the loopcontrols extension and the "generation" tag
(AssistantTracker, which outside assistant-mask tracking renders its body unchanged), tojson as
json.dumps(ensure_ascii=False, indent, separators, sort_keys), raise_exception and strftime_now;
rendered with messages, tools, documents (None), add_generation_prompt, the special tokens that
are set (apply_chat_template passes {**special_tokens_map, **kwargs}) and the case's kwargs. The
template is found as transformers finds it: chat_template.jinja, else chat_template.json, else
tokenizer_config.json's chat_template (a string, or a list of {name, template}: "tool_use" when
tools are given and there is one, else "default").

The one change: strftime_now reads a fixed clock (argv), the one the Go side is given, so that
templates printing the date (gpt-oss) compare.

Usage: python3 reference.py <corpus.json> <clock, ISO 8601> <model dir>...
Prints one JSON line per (model dir, chat case), in corpus order:
  {"model": dir, "name": case name, "text": rendered text}, or
  {"model": dir, "name": case name, "error": "<ExceptionType>: message", "raised": true if the
   template itself called raise_exception}
"""

import json
import os
import sys
from datetime import datetime

try:
    import jinja2
    import jinja2.ext
    from jinja2.ext import Extension
    from jinja2.sandbox import ImmutableSandboxedEnvironment
except ImportError as e:  # the Go test reports this output as the failure
    sys.exit(f"reference.py: cannot import jinja2 ({e}): install Jinja2 >= 3.1 (Debian: apt-get install python3-jinja2)")

SPECIAL_TOKENS = ["bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"]


class AssistantTracker(Extension):
    """transformers' {% generation %} tag; with no tracker active it renders its body as is."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_generation_support"), [], [], body).set_lineno(lineno)

    @jinja2.pass_eval_context
    def _generation_support(self, context, caller):
        return caller()


def compile_template(source, clock):
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format):
        return clock.strftime(format)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[AssistantTracker, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env.from_string(source)


def token_content(v):
    if isinstance(v, dict):
        return v.get("content")
    return v


def read_json(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def load_model(d):
    """The templates by name and the special tokens of the model in d."""
    config = read_json(os.path.join(d, "tokenizer_config.json"))
    stm = os.path.join(d, "special_tokens_map.json")
    if os.path.exists(stm):
        config.update({k: v for k, v in read_json(stm).items() if k in SPECIAL_TOKENS or k == "additional_special_tokens"})
    jinja_path, json_path = os.path.join(d, "chat_template.jinja"), os.path.join(d, "chat_template.json")
    if os.path.exists(jinja_path):
        with open(jinja_path, encoding="utf-8") as f:
            field = f.read()
    elif os.path.exists(json_path):
        field = read_json(json_path)["chat_template"]
    else:
        field = config.get("chat_template")
    if isinstance(field, list):
        templates = {t["name"]: t["template"] for t in field}
    elif field is None:
        templates = {}
    else:
        templates = {"default": field}
    tokens = {}
    for key in SPECIAL_TOKENS:
        content = token_content(config.get(key))
        if content:
            tokens[key] = content
    extra = config.get("additional_special_tokens")
    if extra is not None:
        tokens["additional_special_tokens"] = [token_content(t) for t in extra]
    return templates, tokens


def main():
    if len(sys.argv) < 4:
        sys.exit("usage: python3 reference.py <corpus.json> <clock, ISO 8601> <model dir>...")
    corpus = read_json(sys.argv[1])["chat"]
    clock = datetime.fromisoformat(sys.argv[2])
    out = sys.stdout
    for d in sys.argv[3:]:
        templates, tokens = load_model(d)
        compiled = {name: compile_template(src, clock) for name, src in templates.items()}
        for case in corpus:
            row = {"model": d, "name": case["name"]}
            tools = case.get("tools")
            name = "tool_use" if tools is not None and "tool_use" in compiled else "default"
            try:
                row["text"] = compiled[name].render(
                    messages=case["messages"],
                    tools=tools,
                    documents=case.get("documents"),
                    add_generation_prompt=bool(case.get("add_generation_prompt")),
                    **{**tokens, **(case.get("kwargs") or {})},
                )
            except jinja2.exceptions.TemplateError as e:
                row["error"] = f"{type(e).__name__}: {e}"
                row["raised"] = type(e) is jinja2.exceptions.TemplateError
            except Exception as e:  # a template error Python raises (TypeError, ...): no text either
                row["error"] = f"{type(e).__name__}: {e}"
            out.write(json.dumps(row, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
