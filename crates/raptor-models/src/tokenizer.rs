//! Tokenizers: GPT-2 byte-level BPE for the decoders, and a corpus-trained (or local
//! `tokenizer.json`) tokenizer for the encoders; records to token-id lists with typed errors.
//!
//! - [`Gpt2Tokenizer`] is tiktoken-rs's `r50k_base` (GPT-2's encoding). Its ranks are compiled
//!   into the tiktoken-rs crate (`include_str!` of `assets/r50k_base.tiktoken`), so building it
//!   never touches the network.
//! - [`CorpusTokenizer`] wraps a Hugging Face `tokenizers` tokenizer: trained on the user's
//!   lines ([`CorpusTokenizer::train`], WordPiece or byte-level BPE, special tokens
//!   `[PAD]`=0, `[UNK]`=1, `[CLS]`=2, `[SEP]`=3), or read from a local `tokenizer.json`.
//! - [`encode_records`] turns texts into right-truncated token records, failing with
//!   [`ModelError::EmptyRecord`] for a record without tokens and
//!   [`ModelError::TokenOutOfRange`] for an id the model's vocabulary lacks; the records go to
//!   [`crate::Batch::from_records`].
//!
//! ```
//! use raptor_models::tokenizer::{Gpt2Tokenizer, TextTokenizer, encode_records};
//! let tok = Gpt2Tokenizer::new()?;
//! let ids = tok.encode("Hello world")?;
//! assert_eq!(tok.decode(&ids)?, "Hello world");
//! let records = encode_records(&tok, &["a first record", "a second"], 16, Some(50257))?;
//! assert_eq!(records.len(), 2);
//! assert!(encode_records(&tok, &["fine", ""], 16, None).is_err());
//! # Ok::<(), raptor_models::ModelError>(())
//! ```

use crate::error::{ModelError, Result};
use std::path::Path;
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::decoders::wordpiece::WordPiece as WordPieceDecoder;
use tokenizers::models::TrainerWrapper;
use tokenizers::models::bpe::{BPE, BpeTrainerBuilder};
use tokenizers::models::wordpiece::{WordPiece, WordPieceTrainerBuilder};
use tokenizers::normalizers::bert::BertNormalizer;
use tokenizers::pre_tokenizers::bert::BertPreTokenizer;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::{
    AddedToken, DecoderWrapper, ModelWrapper, NormalizerWrapper, PostProcessorWrapper,
    PreTokenizerWrapper, Tokenizer, TokenizerBuilder,
};

/// GPT-2's vocabulary size (50,000 merges + 256 bytes + `<|endoftext|>`).
pub const GPT2_VOCAB_SIZE: usize = 50257;
/// GPT-2's `<|endoftext|>` id (also its usual padding id; padded positions are masked).
pub const GPT2_EOS: u32 = 50256;

fn tok_err(e: impl std::fmt::Display) -> ModelError {
    ModelError::Tokenizer(e.to_string())
}

/// What the record encoder needs from a tokenizer.
pub trait TextTokenizer {
    /// Token ids of `text` (no special tokens added).
    fn encode(&self, text: &str) -> Result<Vec<u32>>;
    /// Text of token ids; an unknown id is an error naming it.
    fn decode(&self, ids: &[u32]) -> Result<String>;
    /// Vocabulary size (ids are in `[0, vocab_size)`).
    fn vocab_size(&self) -> usize;
    /// Padding id.
    fn pad_id(&self) -> u32;
    /// Ids a classifier's record starts and ends with (e.g. BERT's `[CLS]` / `[SEP]`), added
    /// around the (truncated) [`TextTokenizer::encode`] output; none by default.
    fn special_ids(&self) -> (Vec<u32>, Vec<u32>) {
        (Vec::new(), Vec::new())
    }
    /// The id that stands for text the vocabulary does not cover (WordPiece's `[UNK]`); none
    /// for tokenizers that cover every input (bytes, byte-level BPE).
    fn unk_id(&self) -> Option<u32> {
        None
    }
}

/// GPT-2 byte-level BPE (tiktoken-rs `r50k_base`; ranks embedded in the binary).
pub struct Gpt2Tokenizer {
    bpe: tiktoken_rs::CoreBPE,
}

impl std::fmt::Debug for Gpt2Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Gpt2Tokenizer(r50k_base)")
    }
}

impl Gpt2Tokenizer {
    /// Builds the encoder from the embedded ranks (about 0.1 s; share one instance).
    pub fn new() -> Result<Self> {
        Ok(Self {
            bpe: tiktoken_rs::r50k_base().map_err(tok_err)?,
        })
    }

    /// Ids of `text`, reading `<|endoftext|>` as the special token (id 50256) rather than as
    /// plain text.
    pub fn encode_with_special_tokens(&self, text: &str) -> Vec<u32> {
        self.bpe.encode_with_special_tokens(text)
    }
}

impl TextTokenizer for Gpt2Tokenizer {
    /// Ids of `text`; `<|endoftext|>` in the text is encoded as ordinary text.
    fn encode(&self, text: &str) -> Result<Vec<u32>> {
        Ok(self.bpe.encode_ordinary(text))
    }

    fn decode(&self, ids: &[u32]) -> Result<String> {
        if let Some(&bad) = ids.iter().find(|&&i| i as usize >= GPT2_VOCAB_SIZE) {
            return Err(ModelError::Tokenizer(format!(
                "token id {bad} is out of range for GPT-2's vocabulary of {GPT2_VOCAB_SIZE}"
            )));
        }
        let bytes = self.bpe.decode_bytes(ids).map_err(tok_err)?;
        String::from_utf8(bytes)
            .map_err(|e| ModelError::Tokenizer(format!("decoded bytes are not UTF-8: {e}")))
    }

    fn vocab_size(&self) -> usize {
        GPT2_VOCAB_SIZE
    }

    fn pad_id(&self) -> u32 {
        GPT2_EOS
    }
}

/// UTF-8 bytes as tokens: a tokenizer that depends on no data at all (id = byte + 3;
/// `0` padding, `1` BOS, `2` EOS; vocabulary 259). The safe default for models trained from
/// scratch on private records: a vocabulary learned from private text would itself leak it.
///
/// ```
/// use raptor_models::tokenizer::{ByteTokenizer, TextTokenizer};
/// let t = ByteTokenizer;
/// let ids = t.encode("hé")?;
/// assert_eq!(ids, vec![b'h' as u32 + 3, 0xc3 + 3, 0xa9 + 3]);
/// assert_eq!(t.decode(&ids)?, "hé");
/// # Ok::<(), raptor_models::ModelError>(())
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ByteTokenizer;

impl ByteTokenizer {
    /// Id of the first byte.
    pub const OFFSET: u32 = 3;
    /// Beginning-of-sequence id.
    pub const BOS: u32 = 1;
    /// End-of-sequence id.
    pub const EOS: u32 = 2;
}

impl TextTokenizer for ByteTokenizer {
    fn encode(&self, text: &str) -> Result<Vec<u32>> {
        Ok(text.bytes().map(|b| u32::from(b) + Self::OFFSET).collect())
    }

    fn decode(&self, ids: &[u32]) -> Result<String> {
        let mut bytes = Vec::with_capacity(ids.len());
        for &i in ids {
            match i {
                0..=2 => {}
                3..=258 => bytes.push((i - Self::OFFSET) as u8),
                bad => {
                    return Err(ModelError::Tokenizer(format!(
                        "token id {bad} is out of range for the byte vocabulary of 259"
                    )));
                }
            }
        }
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    fn vocab_size(&self) -> usize {
        259
    }

    fn pad_id(&self) -> u32 {
        0
    }
}

/// Subword model of a corpus-trained tokenizer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum CorpusModel {
    /// BERT-style WordPiece (BERT normalizer and pre-tokenizer, `##` continuation).
    WordPiece,
    /// GPT-2-style byte-level BPE (never produces `[UNK]`).
    ByteLevelBpe,
}

/// Settings of [`CorpusTokenizer::train`].
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CorpusTokenizerConfig {
    /// Subword model.
    pub model: CorpusModel,
    /// Target vocabulary size, special tokens included.
    pub vocab_size: usize,
    /// Minimum pair frequency for a merge.
    pub min_frequency: u64,
    /// Lowercase (and strip accents) first (WordPiece only).
    pub lowercase: bool,
}

impl Default for CorpusTokenizerConfig {
    fn default() -> Self {
        Self {
            model: CorpusModel::WordPiece,
            vocab_size: 8000,
            min_frequency: 2,
            lowercase: true,
        }
    }
}

/// The continuation pieces (`##c`) of every character that a word of `lines` holds after its
/// first one, as the WordPiece trainer would form them (BERT normalizer with `lowercase`, BERT
/// pre-tokenizer), in character order.
fn continuation_pieces(lines: &[String], lowercase: bool) -> Result<Vec<String>> {
    use tokenizers::{
        NormalizedString, Normalizer, OffsetReferential, OffsetType, PreTokenizedString,
        PreTokenizer,
    };
    let normalizer = BertNormalizer::new(true, true, None, lowercase);
    let mut chars = std::collections::BTreeSet::new();
    for line in lines {
        let mut n = NormalizedString::from(line.as_str());
        normalizer.normalize(&mut n).map_err(tok_err)?;
        let mut pre = PreTokenizedString::from(n);
        BertPreTokenizer.pre_tokenize(&mut pre).map_err(tok_err)?;
        for (word, _, _) in pre.get_splits(OffsetReferential::Original, OffsetType::Byte) {
            chars.extend(word.chars().skip(1));
        }
    }
    Ok(chars.into_iter().map(|c| format!("##{c}")).collect())
}

/// Removes the `##c` pieces that [`CorpusTokenizer::train`] registered as special tokens from
/// the added tokens of `tok` (they stay in the WordPiece vocabulary under their ids, as ordinary
/// pieces).
fn unregister_pieces(tok: &Tokenizer, pieces: &[String]) -> Result<Tokenizer> {
    let json = tok.to_string(false).map_err(tok_err)?;
    let mut v: serde_json::Value =
        serde_json::from_str(&json).map_err(|e| ModelError::Tokenizer(e.to_string()))?;
    let pieces: std::collections::BTreeSet<&str> = pieces.iter().map(String::as_str).collect();
    if let Some(added) = v["added_tokens"].as_array_mut() {
        added.retain(|t| !t["content"].as_str().is_some_and(|c| pieces.contains(c)));
    }
    let out = serde_json::to_string(&v).map_err(|e| ModelError::Tokenizer(e.to_string()))?;
    out.parse::<Tokenizer>().map_err(tok_err)
}

/// A Hugging Face `tokenizers` tokenizer trained on the user's corpus or read from
/// `tokenizer.json`.
#[derive(Debug, Clone)]
pub struct CorpusTokenizer {
    tok: Tokenizer,
    pad_id: u32,
    specials: (Vec<u32>, Vec<u32>),
}

impl CorpusTokenizer {
    /// Special tokens of trained tokenizers, with their ids 0, 1, 2, 3.
    pub const SPECIAL_TOKENS: [&'static str; 4] = ["[PAD]", "[UNK]", "[CLS]", "[SEP]"];

    /// Trains on lines of text (e.g. the training split; for DP, train the tokenizer on public
    /// text or account for it, since its vocabulary depends on the data).
    pub fn train<I, S>(lines: I, cfg: &CorpusTokenizerConfig) -> Result<Self>
    where
        I: IntoIterator<Item = S>,
        I::IntoIter: Send,
        S: AsRef<str> + Send,
    {
        if cfg.vocab_size <= Self::SPECIAL_TOKENS.len() {
            return Err(ModelError::Tokenizer(format!(
                "vocab_size {} leaves no room beyond the {} special tokens",
                cfg.vocab_size,
                Self::SPECIAL_TOKENS.len()
            )));
        }
        let lines: Vec<String> = lines.into_iter().map(|l| l.as_ref().to_string()).collect();
        // WordPiece: the trainer adds each continuation piece `##c` when it first meets it while
        // walking a hash map of the corpus's words, whose order changes from process to
        // process; the pieces' ids, the merges' tie-breaks (by id) and so the vocabulary would
        // change with it. Registered first, in character order, they get the same ids every
        // time (and are ordinary pieces again after training).
        let pieces = match cfg.model {
            CorpusModel::WordPiece => continuation_pieces(&lines, cfg.lowercase)?,
            CorpusModel::ByteLevelBpe => Vec::new(),
        };
        let specials: Vec<AddedToken> = Self::SPECIAL_TOKENS
            .iter()
            .map(|s| AddedToken::from(*s, true))
            .chain(pieces.iter().map(|p| AddedToken::from(p.as_str(), true)))
            .collect();
        type Builder = TokenizerBuilder<
            ModelWrapper,
            NormalizerWrapper,
            PreTokenizerWrapper,
            PostProcessorWrapper,
            DecoderWrapper,
        >;
        let (mut tok, mut trainer): (_, TrainerWrapper) = match cfg.model {
            CorpusModel::WordPiece => {
                let model = WordPiece::builder()
                    .unk_token("[UNK]".into())
                    .build()
                    .map_err(tok_err)?;
                let tok = Builder::new()
                    .with_model(model.into())
                    .with_normalizer(Some(
                        BertNormalizer::new(true, true, None, cfg.lowercase).into(),
                    ))
                    .with_pre_tokenizer(Some(BertPreTokenizer.into()))
                    .with_decoder(Some(WordPieceDecoder::default().into()))
                    .build()
                    .map_err(tok_err)?;
                let trainer = WordPieceTrainerBuilder::new()
                    .vocab_size(cfg.vocab_size)
                    .min_frequency(cfg.min_frequency)
                    .special_tokens(specials)
                    .show_progress(false)
                    .build();
                (tok, trainer.into())
            }
            CorpusModel::ByteLevelBpe => {
                let tok = Builder::new()
                    .with_model(BPE::default().into())
                    .with_pre_tokenizer(Some(ByteLevel::default().add_prefix_space(false).into()))
                    .with_decoder(Some(ByteLevelDecoder::default().into()))
                    .build()
                    .map_err(tok_err)?;
                let trainer = BpeTrainerBuilder::new()
                    .vocab_size(cfg.vocab_size)
                    .min_frequency(cfg.min_frequency)
                    .special_tokens(specials)
                    .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
                    .show_progress(false)
                    .build();
                (tok, trainer.into())
            }
        };
        tok.train(&mut trainer, lines.iter().map(String::as_str))
            .map_err(tok_err)?;
        let mut tok = Tokenizer::from(tok);
        if !pieces.is_empty() {
            tok = unregister_pieces(&tok, &pieces)?;
        }
        let pad_id = tok
            .token_to_id("[PAD]")
            .ok_or_else(|| ModelError::Tokenizer("trained tokenizer lacks [PAD]".into()))?;
        Ok(Self {
            tok,
            pad_id,
            specials: Default::default(),
        })
    }

    /// Reads a `tokenizer.json`. The padding id is the file's padding setting, else the id of
    /// the first of `[PAD]`, `<pad>`, `<|pad|>`, `<|endoftext|>` present, else 0 (padded
    /// positions are masked, so any valid id works).
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        if !path.is_file() {
            return Err(ModelError::Io {
                path: path.display().to_string(),
                source: std::io::Error::new(std::io::ErrorKind::NotFound, "no such tokenizer.json"),
            });
        }
        let bytes = std::fs::read(path).map_err(|source| ModelError::Io {
            path: path.display().to_string(),
            source,
        })?;
        Self::from_json_bytes(&bytes, &path.display().to_string())
    }

    /// Parses the bytes of a `tokenizer.json` (`origin` names them in errors, e.g. the file's
    /// path); the padding id as in [`CorpusTokenizer::from_file`]. Bytes that are not a valid
    /// tokenizer are an error, never a panic.
    pub fn from_json_bytes(bytes: &[u8], origin: &str) -> Result<Self> {
        let tok = Tokenizer::from_bytes(bytes)
            .map_err(|e| ModelError::Tokenizer(format!("{origin}: {e}")))?;
        Ok(Self::from_tokenizer(tok))
    }

    /// Wraps a `tokenizers` tokenizer (padding id as in [`CorpusTokenizer::from_file`]).
    pub fn from_tokenizer(tok: Tokenizer) -> Self {
        let pad_id = tok
            .get_padding()
            .map(|p| p.pad_id)
            .or_else(|| {
                ["[PAD]", "<pad>", "<|pad|>", "<|endoftext|>"]
                    .iter()
                    .find_map(|t| tok.token_to_id(t))
            })
            .unwrap_or(0);
        Self {
            tok,
            pad_id,
            specials: Default::default(),
        }
    }

    /// Writes `tokenizer.json`.
    pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        self.tok
            .save(path, false)
            .map_err(|e| ModelError::Tokenizer(format!("{}: {e}", path.display())))
    }

    /// Reads a `tokenizer.json` for an encoder (e.g. BERT's WordPiece) with the file's padding
    /// and truncation switched off (all-MiniLM-L6-v2's file pads and truncates every input to
    /// 128; raptor pads batches itself and truncates records explicitly). The padding id is
    /// the file's padding setting, read before it is switched off.
    pub fn from_file_unpadded(path: impl AsRef<Path>) -> Result<Self> {
        let mut t = Self::from_file(path)?;
        t.tok.with_padding(None);
        t.tok
            .with_truncation(None)
            .map_err(|e| ModelError::Tokenizer(format!("switching truncation off: {e}")))?;
        Ok(t)
    }

    /// Token ids with the tokenizer's special tokens (its post-processor's template, e.g.
    /// `[CLS] … [SEP]` for BERT). [`TextTokenizer::encode`] adds none.
    pub fn encode_with_special_tokens(&self, text: &str) -> Result<Vec<u32>> {
        Ok(self
            .tok
            .encode(text, true)
            .map_err(tok_err)?
            .get_ids()
            .to_vec())
    }

    /// Makes [`TextTokenizer::special_ids`] return the ids the file's post-processor puts
    /// before and after a single sequence (`[CLS]` and `[SEP]` for BERT's template), found by
    /// encoding a probe text with and without special tokens. A tokenizer without a
    /// post-processor gets none. Error: the plain ids are not a contiguous part of the ids with
    /// special tokens (a post-processor that rewrites the text's tokens).
    pub fn with_special_tokens(mut self) -> Result<Self> {
        let probe = "a b";
        let plain = self.tok.encode(probe, false).map_err(tok_err)?;
        let full = self.tok.encode(probe, true).map_err(tok_err)?;
        let (plain, full) = (plain.get_ids(), full.get_ids());
        let at = (0..=full.len().saturating_sub(plain.len()))
            .find(|&i| full.get(i..i + plain.len()) == Some(plain))
            .ok_or_else(|| {
                ModelError::Tokenizer(format!(
                    "the post-processor changes the tokens of {probe:?} ({plain:?} -> {full:?}): \
                     cannot tell its special tokens apart"
                ))
            })?;
        self.specials = (full[..at].to_vec(), full[at + plain.len()..].to_vec());
        Ok(self)
    }

    /// The id of a token string.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.tok.token_to_id(token)
    }

    /// The wrapped `tokenizers` tokenizer.
    pub fn inner(&self) -> &Tokenizer {
        &self.tok
    }
}

impl TextTokenizer for CorpusTokenizer {
    fn encode(&self, text: &str) -> Result<Vec<u32>> {
        Ok(self
            .tok
            .encode(text, false)
            .map_err(tok_err)?
            .get_ids()
            .to_vec())
    }

    fn decode(&self, ids: &[u32]) -> Result<String> {
        let v = self.vocab_size();
        if let Some(&bad) = ids.iter().find(|&&i| i as usize >= v) {
            return Err(ModelError::Tokenizer(format!(
                "token id {bad} is out of range for a vocabulary of {v}"
            )));
        }
        self.tok.decode(ids, true).map_err(tok_err)
    }

    fn vocab_size(&self) -> usize {
        self.tok.get_vocab_size(true)
    }

    fn pad_id(&self) -> u32 {
        self.pad_id
    }

    fn special_ids(&self) -> (Vec<u32>, Vec<u32>) {
        self.specials.clone()
    }

    /// `[UNK]` or `<unk>`, whichever the vocabulary has.
    fn unk_id(&self) -> Option<u32> {
        ["[UNK]", "<unk>"]
            .iter()
            .find_map(|t| self.tok.token_to_id(t))
    }
}

/// Encodes records into token-id lists (ready for [`crate::Batch::from_records`]), keeping the
/// first `max_len` tokens of each. A record with no token is [`ModelError::EmptyRecord`]; with
/// `model_vocab` given, an id ≥ it is [`ModelError::TokenOutOfRange`] (a tokenizer larger than
/// the model's embedding).
pub fn encode_records<T, S>(
    tok: &T,
    records: &[S],
    max_len: usize,
    model_vocab: Option<i64>,
) -> Result<Vec<Vec<i64>>>
where
    T: TextTokenizer + ?Sized,
    S: AsRef<str>,
{
    if max_len == 0 {
        return Err(ModelError::InvalidConfig(
            "max_len must be at least 1".into(),
        ));
    }
    let mut out = Vec::with_capacity(records.len());
    for (r, text) in records.iter().enumerate() {
        let text = text.as_ref();
        let mut ids: Vec<i64> = tok.encode(text)?.into_iter().map(i64::from).collect();
        if ids.is_empty() {
            return Err(ModelError::EmptyRecord {
                record: r,
                why: if text.trim().is_empty() {
                    "its text is empty".into()
                } else {
                    format!("its text {text:?} encodes to no token")
                },
            });
        }
        ids.truncate(max_len);
        out.push(ids);
    }
    if let Some(v) = model_vocab {
        check_token_ids(&out, v)?;
    }
    Ok(out)
}

/// Checks that every id of every record is in `[0, vocab_size)`; the error names the first
/// offending record, position and id.
pub fn check_token_ids(records: &[Vec<i64>], vocab_size: i64) -> Result<()> {
    for (r, rec) in records.iter().enumerate() {
        if let Some((p, &id)) = rec
            .iter()
            .enumerate()
            .find(|(_, id)| !(0..vocab_size).contains(*id))
        {
            return Err(ModelError::TokenOutOfRange {
                record: r,
                position: p,
                id,
                vocab_size,
            });
        }
    }
    Ok(())
}
