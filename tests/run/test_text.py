"""`graphrt run --prompt`: real text in, each mode's continuation out, as Hugging Face would.

The tokenizer is a small byte-level BPE that each test session trains with the `tokenizers`
library and saves beside a random HF checkpoint, as a real model directory holds both.
"""

import json

import pytest
import torch
from conftest import save_reference, train_tokenizer
from cli_checks import one_line_error

from graphrt.errors import GraphrtError
from graphrt.model.config import PRESETS
from graphrt.run import text
from graphrt.run.execute import run
from graphrt.run.spec import RunSpec

tokenizers = pytest.importorskip("tokenizers")  # a core dependency, but a bare image may lack it

PROMPTS = ["The quick brown fox", "A decode step is hundreds of tiny kernels;\nthe"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """(directory with config.json, model.safetensors and tokenizer.json; HF's model)."""
    directory = tmp_path_factory.mktemp("qwen2-text")
    hf = save_reference(PRESETS["tiny"], directory)
    train_tokenizer().save(str(directory / text.TOKENIZER_FILE))
    return directory, hf


@pytest.mark.parametrize("sample", [*PROMPTS, "  two spaces, a tab\tand ünïcödé"])
def test_text_round_trips_through_the_tokenizer(model_dir, sample):
    tokenizer = text.load_tokenizer(str(model_dir[0]))
    (ids,) = text.encode_rows(tokenizer, [sample], batch=1)
    assert len(ids) > 1
    assert text.decode_rows(tokenizer, [list(ids)]) == [sample]


def test_continuations_equal_hf_generate_row_by_row(cli, model_dir, tmp_path):
    transformers = pytest.importorskip("transformers")
    directory, hf = model_dir
    out = tmp_path / "run.json"
    result = cli("run", "--model", directory, "--prompt", PROMPTS[0], "--prompt", PROMPTS[1],
                 "--steps", 10, "--mode", "both", "--json", out)
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    hf_tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_file=str(directory / "tokenizer.json"))
    assert doc["prompt_text"] == PROMPTS
    for row, prompt in enumerate(PROMPTS):
        ids = hf_tokenizer(prompt, return_tensors="pt").input_ids  # [1, T]: HF's own encoding
        assert doc["prompt_ids"][row] == ids[0].tolist()
        # each row alone, unpadded: the batch is right-padded, the prompts differ in length
        expected = hf.generate(ids, max_new_tokens=11, do_sample=False,
                               attention_mask=torch.ones_like(ids))[0, ids.shape[1]:]
        for mode in ("eager", "graph"):
            assert doc["modes"][mode]["generated_ids"][row] == expected.tolist()
            assert doc["modes"][mode]["generated_text"][row] == hf_tokenizer.decode(expected)
    assert len(doc["prompt_ids"][0]) != len(doc["prompt_ids"][1])


def test_the_run_prints_each_modes_continuation_under_the_table(cli, model_dir):
    directory, _ = model_dir
    result = cli("run", "--model", directory, "--prompt", PROMPTS[0], "--batch", 3, "--steps", 4,
                 "--mode", "both")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert "batch 3" in lines[0]
    rows = [i for i, line in enumerate(lines) if line.startswith("row ")]
    assert [lines[i] for i in rows] == [f"row {r}: {json.dumps(PROMPTS[0])}" for r in range(3)]
    assert rows[0] > next(i for i, line in enumerate(lines) if line.startswith("graph "))
    continuations = [lines[i + 1: i + 3] for i in rows]
    assert [line.split("→")[0].strip() for line in continuations[0]] == ["eager", "graph"]
    # one prompt over three rows: three equal continuations
    assert continuations[0] == continuations[1] == continuations[2]


def test_several_prompts_need_a_matching_batch(model_dir):
    tokenizer = text.load_tokenizer(str(model_dir[0]))
    with pytest.raises(GraphrtError, match="--batch 2 with 3 --prompt values"):
        text.encode_rows(tokenizer, ["a", "b", "c"], batch=2)
    assert len(text.encode_rows(tokenizer, ["a", "b", "c"], batch=3)) == 3


def test_an_empty_prompt_is_a_clear_error(cli, model_dir):
    one_line_error(cli("run", "--model", model_dir[0], "--prompt", ""), "--prompt '' encodes to no tokens")


def test_prompt_and_prompt_len_together_are_a_clear_error(cli, model_dir):
    # the text's tokens set the prompt's length: a --prompt-len beside it would be ignored
    one_line_error(cli("run", "--model", model_dir[0], "--prompt", "hello", "--prompt-len", 4),
                   "--prompt-len and --prompt")


def test_prompt_with_a_preset_is_a_clear_error(cli):
    one_line_error(cli("run", "--model", "tiny", "--prompt", "hello"),
                   "--prompt needs a model directory with a tokenizer.json", "'tiny'")


def test_prompt_without_a_tokenizer_is_a_clear_error(cli, tmp_path):
    save_reference(PRESETS["tiny"], tmp_path)
    one_line_error(cli("run", "--model", tmp_path, "--prompt", "hello"),
                   f"{tmp_path / 'tokenizer.json'}: no such file")


def test_a_malformed_tokenizer_is_a_clear_error(cli, tmp_path):
    save_reference(PRESETS["tiny"], tmp_path)
    (tmp_path / "tokenizer.json").write_text('{"model": 3}')
    one_line_error(cli("run", "--model", tmp_path, "--prompt", "hello"),
                   "tokenizer.json: not a tokenizer the tokenizers library reads")


def test_ids_outside_the_models_vocabulary_are_refused():
    with pytest.raises(GraphrtError, match="token id 512 is outside tiny's vocabulary of 512"):
        run(RunSpec(model="tiny", steps=2, prompt_ids=((3, 512),)))


@pytest.fixture(scope="module")
def tokenizer():
    """The test tokenizer alone, for the rules that need no model."""
    return train_tokenizer()


def _ids(tokenizer, *texts: str) -> torch.Tensor:
    """One row of ids per text (texts of the same number of tokens), as a run's `generated` holds them."""
    return torch.tensor([tokenizer.encode(t).ids for t in texts])


def test_each_row_lists_its_prompt_then_each_modes_continuation_quoted_and_lined_up(tokenizer):
    prompts = text.encode_rows(tokenizer, ["Über straße,", "tiny kernels;\nthe"], batch=1)
    generated = {"eager": _ids(tokenizer, " naïve café", " jumps over"),
                 "compiled": _ids(tokenizer, " the lazy dog", " over the lazy")}
    # quoted as JSON shows a newline as \n and leading spaces plainly; non-ASCII stays as it is,
    # and the modes' names are padded to the longest ("compiled") so the arrows line up
    assert text.continuation_lines(tokenizer, prompts, generated) == [
        'row 0: "Über straße,"',
        '  eager    → " naïve café"',
        '  compiled → " the lazy dog"',
        'row 1: "tiny kernels;\\nthe"',
        '  eager    → " jumps over"',
        '  compiled → " over the lazy"',
    ]
    # with no mode's output, the prompts alone
    assert text.continuation_lines(tokenizer, prompts, {}) == [
        'row 0: "Über straße,"', 'row 1: "tiny kernels;\\nthe"']


def test_decoding_keeps_special_tokens_as_hf_decode_does(tokenizer):
    end = tokenizer.token_to_id("<|endoftext|>")
    row = [*tokenizer.encode("The quick").ids, end]
    assert text.decode_rows(tokenizer, [row]) == ["The quick<|endoftext|>"]
    assert text.decode_rows(tokenizer, torch.tensor([row, row])) == ["The quick<|endoftext|>"] * 2


@pytest.mark.parametrize("count, batch, rows", [
    (1, 3, 3),  # one prompt fills every row
    (2, 1, 2),  # one row per prompt, --batch left at 1
    (2, 2, 2),  # ... or given as the number of prompts
])
def test_one_prompt_fills_the_batch_and_several_give_one_row_each(tokenizer, count, batch, rows):
    prompts = ["The quick brown fox", "Graphs replay"][:count]
    got = text.encode_rows(tokenizer, prompts, batch=batch)
    assert len(got) == rows
    assert text.decode_rows(tokenizer, [list(r) for r in got]) == (prompts * rows)[:rows]


def test_two_prompts_with_a_batch_of_three_is_a_clear_error(tokenizer):
    with pytest.raises(GraphrtError) as raised:
        text.encode_rows(tokenizer, ["a", "b"], batch=3)
    assert str(raised.value) == "--batch 3 with 2 --prompt values: give one prompt for all rows or one --prompt per row"


def test_a_malformed_tokenizer_is_reported_with_the_librarys_own_reason(tmp_path):
    path = tmp_path / text.TOKENIZER_FILE
    path.write_text('{"model": 3}')
    with pytest.raises(Exception) as library:  # what the tokenizers library itself says of the file
        tokenizers.Tokenizer.from_file(str(path))
    reason = str(library.value).splitlines()[0]
    assert reason  # the library gives a reason (a line that says where it failed)
    with pytest.raises(GraphrtError) as raised:
        text.load_tokenizer(str(tmp_path))
    assert str(raised.value) == f"{path}: not a tokenizer the tokenizers library reads ({reason})"
