// The parity reference of tests/data/byte_level_bpe_test.cpp: Hugging Face's own JavaScript
// tokenizers (npm @huggingface/tokenizers, installed at configure time by tests/data/CMakeLists.txt).
//   node hf_tokenize.mjs PACKAGE_DIR TOKENIZER_DIR TEXT_FILE...
// prints, for each text file, one line of JSON: {"ids": [...], "text": decode(ids)}, encoded
// without special tokens added (as loco tokenizes documents).
import { readFileSync } from "node:fs";
import { pathToFileURL } from "node:url";

const [pkg, dir, ...files] = process.argv.slice(2);
const { Tokenizer } = await import(pathToFileURL(`${pkg}/dist/tokenizers.mjs`).href);
const tokenizer = new Tokenizer(JSON.parse(readFileSync(`${dir}/tokenizer.json`, "utf8")),
                                JSON.parse(readFileSync(`${dir}/tokenizer_config.json`, "utf8")));
for (const file of files) {
  const ids = tokenizer.encode(readFileSync(file, "utf8"), { add_special_tokens: false }).ids;
  const text = ids.length ? tokenizer.decode(ids, { clean_up_tokenization_spaces: false }) : "";
  console.log(JSON.stringify({ ids, text }));
}
