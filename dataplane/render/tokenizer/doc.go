// Package tokenizer encodes text into the ids of a Hugging Face tokenizer.json, in process and in
// pure Go, for byte-level BPE families (Qwen, Llama 3, DeepSeek-V3, gpt-oss, GPT-2/GPT-4 style)
// and SentencePiece-style BPE with byte fallback (Llama 2, Mistral, Gemma 3).
//
// # Exactness
//
// The reference is @huggingface/transformers 4.3.1, i.e. @huggingface/tokenizers 0.2.0 (the
// JavaScript port of the Rust tokenizers library): ids must be the ones it produces. Everything
// this package cannot reproduce exactly is refused by Load/New with an error naming the JSON
// field, never approximated at request time. Supported:
//
//   - normalizers: NFC, NFD, NFKC, NFKD, Lowercase, Prepend, Replace (String pattern), Strip,
//     Sequence, null;
//   - pre-tokenizers: Split (Regex or String pattern, every behaviour, invert), Digits, Metaspace
//     (replacement, prepend_scheme; split is ignored, as by the reference), Sequence, then one
//     final ByteLevel (add_prefix_space, use_regex), or none;
//   - model: BPE, no dropout, subword prefix or suffix, ignore_merges. With a ByteLevel step the
//     vocabulary is in the byte-level alphabet (every byte and every merge result in it).
//     Without one it is spelled in text, SentencePiece style (sentencepiece.go): BPE merges
//     characters; a character no entry spells becomes its UTF-8 bytes' "<0xXX>" entries
//     (byte_fallback), else unk_token (once for a run with fuse_unk), else nothing;
//   - post-processors: ByteLevel, TemplateProcessing (single), Bert/RobertaProcessing, Sequence;
//   - added tokens (special or not), matched before normalization (normalized: false) or after
//     it (normalized: true), the longest at each position from the left, lstrip/rstrip.
//
// Where the reference and the Rust library disagree:
//
//   - \s: Split patterns mean Unicode White_Space (the reference rewrites \s so; so does
//     Oniguruma), but GPT-2's pattern inside ByteLevel(use_regex) is a plain JS RegExp whose \s is
//     ECMAScript's (U+FEFF yes, U+0085 no). Both are followed.
//   - (?i:...) folds ASCII letters only, as the reference rewrites it; Oniguruma also folds
//     U+017F (ſ) to s and U+212A (K) to k, so "'ſ" is a contraction only for the Rust library.
//   - Digits splits ASCII digits (JS \d); the Rust library uses char::is_numeric.
//   - Strip and lstrip/rstrip trim ECMAScript whitespace; Lowercase is toLowerCase (Final_Sigma).
//   - Split behaviours other than Isolated and Removed, invert with Isolated, and Removed with a
//     String pattern follow the Rust library: the reference ignores the behaviour (treating it as
//     Isolated) and drops gaps under invert, so it is no oracle for those configurations.
//   - single_word: true is refused (the reference ignores it, the Rust library enforces word
//     boundaries), as are Replace with a Regex pattern or a '$' in its content, and Split
//     patterns using constructs whose meaning differs between the dialects (\w, \b, anchors,
//     back-references, POSIX classes, classes under (?i:...)).
//
// Unicode data is Go's (15.0.0) for \p{L}, \p{N}, case mapping and normalization; the reference
// uses its JS engine's ICU (Unicode 17 on Node 20.20): characters assigned after Unicode 15.0
// (e.g. Egyptian Hieroglyphs Extended-A, Garay) can split or normalize differently.
//
// Input is UTF-8; each invalid byte is encoded as U+FFFD, as decoding a JSON string would have
// made it.
//
// # Speed
//
// The known pre-tokenizer patterns (cl100k-style with \p{N} or \p{N}{1,3}, GPT-2's, o200k's and
// DeepSeek-V3's three) are split by hand (split_fast.go, split_more.go), held to the regexp2
// general path by a differential test and FuzzSplit
// (run it with -fuzzminimizetime 100x: minimizing new inputs for the default 60s stalls the fuzzer).
// For the cl100k family and o200k followed by a plain ByteLevel (Qwen, Llama 3, gpt-oss), and
// for DeepSeek-V3's third step on each run of its first two, one loop splits and looks each
// pre-token up in the word cache with the common cases inlined (encode_fast.go). The
// vocabulary and merges are in raw bytes (the byte-level alphabet is decoded once at load), so
// encoding never maps bytes to runes. Merged words are in a lock-free per-tokenizer cache keyed
// by their bytes (wordcache.go). Text is checked for normalization with a per-character table
// (normquick.go), which also checks UTF-8, so already normalized text (nearly all of it) is never
// copied; added tokens are found with IndexByte when they share their first byte, else eight
// bytes a branch, and the split says which token each match is. Merges live in
// an open-addressing table keyed by the packed id pair; the vocabulary in one string arena with a
// hash index; scratch buffers in a sync.Pool, so a warmed Encode allocates nothing. Long words
// (100k spaces) merge with a heap in O(n log n). A SentencePiece vocabulary has no pre-tokenizer
// to make words (Llama 2's and Gemma 3's sections are one pre-token each): the text is cut before
// each "▁" that follows a character no entry joins to a "▁" (Gemma has one such entry, ">▁</"),
// which no merge can cross, so that the pieces are words for the cache and merging stays local.
// Where normalizing only reads spaces as "▁" (Gemma 3's Replace, Llama 2's and Mistral's Prepend
// then Replace, no added token matched on normalized text), a section without "▁" is not
// normalized at all: it is cut at its spaces and its pieces are looked up by their raw bytes
// (encodeRaw); characters of the BMP find their symbol in a table, not a map.
package tokenizer
