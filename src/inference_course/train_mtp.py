"""Train the multi-token-prediction heads of ``drafts.MTPHeads`` on the model's own greedy output.

    python -m inference_course.train_mtp            # writes src/inference_internals/data/mtp_heads.pt

1. Greedy-generate from varied prompts (open questions, and tasks on a given text), batched
   with left padding through Hugging Face's ``generate``, keeping the final hidden state of
   every step: the state h_s that produced token s.
2. Each step is one example: from h_s and token s, head k must predict token s+k.
   The target is what the model itself wrote, so the heads learn to imitate this model,
   which is exactly what a draft needs (its guesses are kept only when they match).
3. Train all heads together with AdamW; the model and its LM head stay frozen. The heads predict
   over the 2,048 tokens the model wrote most often (a frequency-ranked draft vocabulary).

Seeded and deterministic on one machine. Sized to take under 10 minutes on 2 CPU cores.
"""
from __future__ import annotations

import argparse
import itertools
import random
import time

import torch
import torch.nn.functional as F

from inference_internals.drafts import HEADS_PATH, MTPHeads

# Prompts are built from these lists; the chapter's evaluation prompts are not among them.
TOPICS = [
    "volcanoes", "the water cycle", "photosynthesis", "black holes", "the Roman Empire", "honeybees",
    "machine learning", "the French Revolution", "climate change", "the human heart", "electric cars",
    "the Moon landing", "coffee", "the Internet", "earthquakes", "the Great Wall of China", "vaccines",
    "recycling", "the solar system", "dinosaurs", "chess", "the stock market", "rainbows", "sleep",
    "the printing press", "octopuses", "renewable energy", "the Olympic Games", "glaciers", "jazz music",
    "the immune system", "bread baking", "the Amazon rainforest", "gravity", "ancient Egypt",
    "smartphones", "tides", "the Renaissance", "friendship", "time management", "deserts", "bicycles",
    "the periodic table", "whales", "democracy", "the history of writing", "mountains", "thunderstorms",
    "gardening", "the speed of light", "penguins", "public libraries", "antibiotics", "wind turbines",
    "the piano", "coral reefs", "the Industrial Revolution", "exercise", "comets", "tea",
    # everyday life, work and technology: the questions people put to an assistant
    "learning a new language", "saving money", "cooking pasta", "running a marathon", "job interviews",
    "public speaking", "raising a puppy", "moving to a new city", "working in a team", "writing an essay",
    "studying for exams", "starting a small business", "online privacy", "password security", "email etiquette",
    "healthy breakfasts", "houseplants", "camping", "road trips", "budget travel", "learning to swim",
    "meditation", "stress", "procrastination", "habits", "remote meetings", "video games", "board games",
    "photography", "drawing", "knitting", "woodworking", "home repairs", "composting", "bird watching",
    "volunteering", "neighbours", "birthdays", "weddings", "grandparents", "siblings", "homework",
    "spreadsheets", "databases", "Python programming", "web browsers", "cloud storage", "open source software",
    "version control", "debugging code", "unit tests", "computer viruses", "robots", "self-driving cars",
    "3D printing", "virtual reality", "batteries", "the electric grid", "nuclear power", "airplanes",
    "trains", "ships", "bridges", "skyscrapers", "roads", "maps", "clocks", "calendars", "money",
    "banks", "taxes", "insurance", "elections", "newspapers", "podcasts", "movies", "novels", "poetry",
    "museums", "theatre", "opera", "rock music", "painting", "sculpture", "architecture", "fashion",
    "football", "tennis", "basketball", "cycling", "yoga", "hiking", "skiing", "fishing", "farming",
    "forests", "rivers", "oceans", "islands", "volcanic islands", "the Arctic", "Antarctica", "the Sahara",
    "spiders", "ants", "butterflies", "sharks", "elephants", "wolves", "cats", "horses", "owls", "frogs",
    "bacteria", "viruses", "DNA", "evolution", "the brain", "the eyes", "teeth", "bones", "vitamins",
    "water", "salt", "sugar", "chocolate", "cheese", "rice", "apples", "spices", "soup", "pizza",
    "ancient Greece", "the Vikings", "the Silk Road", "the Aztecs", "medieval castles", "pirates",
    "the Cold War", "the space race", "the telephone", "the light bulb", "the steam engine", "writing systems",
    "mathematics", "prime numbers", "fractions", "probability", "statistics", "geometry", "algebra",
    "the weather", "seasons", "snow", "wind", "clouds", "lightning", "the stars", "Mars", "Jupiter", "the Sun",
]
TEMPLATES = [
    "Explain {} to a ten-year-old.", "Write a short paragraph about {}.", "What are three facts about {}?",
    "Give me a brief history of {}.", "Why is {} important?", "Write a short poem about {}.",
    "What are the pros and cons of {}?", "Describe {} in simple terms.",
    "Write a short story that involves {}.", "List some common misconceptions about {}.",
    "How does {} work?", "Write a blog post introduction about {}.", "What would the world be like without {}?",
    "Give three tips for someone who wants to learn about {}.", "Compare {} with something from everyday life.",
    "Write a dialogue between a teacher and a student about {}.", "Summarize what scientists know about {}.",
    "Write a limerick about {}.", "What questions do people often ask about {}? Answer two of them.",
    "Tell me an interesting story from the history of {}.",
    "I am curious about {}. Where should I start?", "What is the most surprising thing about {}?",
    "Write a short speech about {}.", "Give me a step-by-step guide to {}.", "What do experts disagree on about {}?",
    "Write an encouraging note to a friend who is struggling with {}.", "Explain {} in three sentences.",
    "What are the most common mistakes people make with {}?", "Write a riddle whose answer is {}.",
    "How has {} changed over the last hundred years?", "What jobs involve {}?", "Write a product review about {}.",
    "What would you tell a beginner about {}?", "Write a news headline and a short article about {}.",
    "Describe a day in the life of someone who loves {}.", "What are five questions to ask about {}?",
    "Plan a one-hour lesson about {}.", "Is {} overrated? Give both sides.", "Write a haiku about {}.",
    "What is the science behind {}?",
]
PASSAGES = [
    "The city council voted on Tuesday to extend the opening hours of all public libraries. From next month, "
    "branches will stay open until nine in the evening on weekdays, and the central library will open on Sundays. "
    "The change is funded by a small increase in the cultural budget.",
    "Honey never spoils. Archaeologists have found pots of honey in ancient Egyptian tombs that are over three "
    "thousand years old and still edible. Its low water content and high acidity make it a hostile place for bacteria.",
    "Our team meeting is moved from Monday at 10am to Wednesday at 2pm because the conference room is being painted. "
    "Please bring your quarterly reports and be ready to present your top three priorities for the next quarter.",
    "The Nile is the longest river in Africa. It flows north for about 6,650 kilometres through eleven countries "
    "before it empties into the Mediterranean Sea. For thousands of years its floods made the land along its "
    "banks fertile.",
    "To reset your password, open the settings page, click on Security, and choose Reset password. You will receive "
    "an email with a link that is valid for 24 hours. If you do not see the email, check your spam folder.",
    "Mount Everest is the highest mountain above sea level, at 8,849 metres. It lies on the border between Nepal and "
    "China. The first confirmed ascent was made by Edmund Hillary and Tenzing Norgay in 1953.",
    "The new cafe on Main Street serves breakfast all day. Its pancakes are thick and fluffy, the coffee is strong, "
    "and the staff are friendly, but the tables are small and it gets very crowded at weekends.",
    "Regular physical activity lowers the risk of heart disease, improves mood and helps people sleep better. "
    "Adults are advised to do at least 150 minutes of moderate activity, such as brisk walking, every week.",
    "The museum's summer exhibition shows two hundred photographs of city life from the 1950s. Tickets cost ten "
    "dollars for adults and are free for children under twelve. The exhibition closes at the end of August.",
    "Penguins are flightless birds that live almost only in the Southern Hemisphere. Their wings have evolved into "
    "flippers, which make them excellent swimmers. Emperor penguins can dive to more than 500 metres.",
    "The train to the airport leaves every fifteen minutes from platform four. The journey takes about thirty "
    "minutes. Tickets can be bought from the machines in the station hall or with the mobile app.",
    "Solar panels turn sunlight into electricity using cells made of silicon. Their price has fallen by about "
    "ninety percent in the last decade, and in many countries they are now the cheapest source of new power.",
    "Dear Sam, thank you for your order of two blue lamps. Unfortunately one lamp is out of stock until May 3. "
    "We can send the first lamp today and the second one later, or send both together in May. Best regards, Lena",
    "The recipe needs 200 grams of flour, two eggs, a cup of milk and a pinch of salt. Mix everything into a smooth "
    "batter, let it rest for ten minutes, then fry thin pancakes in a hot pan with a little butter.",
    "Octopuses have three hearts and blue blood. They can change the colour and texture of their skin in a fraction "
    "of a second, and they are able to solve simple puzzles, such as opening a jar to reach food.",
    "Reminder: the school trip to the science museum is on Friday. The bus leaves at 8:30 sharp from the main gate. "
    "Students should bring a packed lunch, a water bottle and the signed permission form.",
    "The Wright brothers made the first powered airplane flight in 1903 near Kitty Hawk, North Carolina. The "
    "first flight lasted twelve seconds and covered 37 metres. Within a few years they could fly for over an hour.",
    "Our quarterly sales grew by 12 percent, mainly thanks to the new online shop. Costs rose by 5 percent because "
    "of higher shipping prices. Next quarter we plan to open two new stores and hire ten people.",
    "Sleep is essential for health. During deep sleep the body repairs muscles and the brain stores memories. "
    "Most adults need between seven and nine hours of sleep every night to feel rested.",
    "The bridge on Elm Road will be closed for repairs from June 1 to June 14. Drivers should use Oak Avenue "
    "instead. Pedestrians and cyclists can still cross the bridge on the north side.",
]
TASKS = [
    "Summarize the following text in one sentence:\n\n{}", "Rewrite the following text in a more formal tone:\n\n{}",
    "List the key points of this text:\n\n{}", "Fix any mistakes and improve this text:\n\n{}",
    "Rewrite this text for a child:\n\n{}", "Give this text a title and then repeat it:\n\n{}",
    "Repeat this text, but replace every number with a different one:\n\n{}",
    "Answer in one sentence: what is the main point of this text?\n\n{}",
    "Translate this text into simple English, keeping its meaning:\n\n{}",
    "Continue this text with two more sentences:\n\n{}",
]


N_PROMPTS = 960  # the committed heads' (``python -m inference_course.train_mtp``)


def training_prompts(n: int, seed: int) -> list[str]:
    """``n`` user messages, a seeded mix of open questions and tasks on a given passage."""
    open_ended = [t.format(topic) for t, topic in itertools.product(TEMPLATES, TOPICS)]
    grounded = [t.format(p) for t, p in itertools.product(TASKS, PASSAGES)]
    rng = random.Random(seed)
    rng.shuffle(open_ended)
    rng.shuffle(grounded)
    n_grounded = min(len(grounded), n // 3)
    prompts = grounded[:n_grounded] + open_ended[: n - n_grounded]
    rng.shuffle(prompts)
    return prompts


def draft_vocabulary(written: torch.Tensor, vocab_size: int, size: int, outside: int = -1):
    """A draft's vocabulary: the ``size`` tokens the model wrote most often (``written``: every token it
    wrote), as FR-Spec ranks a draft's (Zhao et al. 2025, https://arxiv.org/abs/2502.14856). Every guess
    multiplies by these rows of the LM head, so each token kept costs every round; one outside is a target
    the draft cannot hit (left out of the loss). Returns the sorted ids [V'], the map from a token id to its
    index among them (``outside`` for the rest) and, for the file's metadata, how many distinct tokens were
    written and the share of the written tokens the vocabulary covers."""
    counts = torch.bincount(written, minlength=vocab_size)
    n_written = int((counts > 0).sum())
    vocab = torch.sort(torch.argsort(counts, descending=True, stable=True)[:min(size, n_written)]).values
    to_small = torch.full((vocab_size,), outside, dtype=torch.long)
    to_small[vocab] = torch.arange(len(vocab))
    return vocab, to_small, {"written_tokens": n_written, "vocab_coverage": float(counts[vocab].sum() / len(written))}


def run_cost(t0: float, cpu0: float, t_gen: float) -> dict:
    """What a training run cost, for its file's metadata (``t0``/``cpu0``: perf_counter/process_time at its start)."""
    return {"generate_seconds": round(t_gen, 1), "total_seconds": round(time.perf_counter() - t0, 1),
            "cpu_seconds": round(time.process_time() - cpu0, 1), "torch_threads": torch.get_num_threads()}


def arguments(doc: str, epochs: int, out) -> argparse.ArgumentParser:
    """The flags every draft's training command takes."""
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--prompts", type=int, default=N_PROMPTS)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--epochs", type=int, default=epochs)
    ap.add_argument("--vocab", type=int, default=2048, help="the draft vocabulary: this many most-written tokens")
    ap.add_argument("--out", default=str(out))
    return ap


@torch.inference_mode()
def generate_sequences(reference, tokenizer, prompts: list[str], max_new_tokens: int, batch_size: int,
                       progress: bool = True) -> list[tuple[torch.Tensor, torch.Tensor, int]]:
    """Greedy generations, each as (tokens [L], hidden [L - 1, D], prompt length): the prompt and the
    output cut after the first EOS, and the final hidden state at every position but the last, the state
    that chose the token after it."""
    from tqdm.auto import tqdm

    side, tokenizer.padding_side = tokenizer.padding_side, "left"  # every row's prompt ends at the same column
    eos = reference.config.eos_token_id
    passes = []  # the final norm's output of each forward: the prompt's [B, P, D], then one [B, 1, D] a step
    hook = reference.model.norm.register_forward_hook(lambda mod, inp, out: passes.append(out.float().cpu()))
    out = []
    try:
        for i in tqdm(range(0, len(prompts), batch_size), desc="generate", disable=not progress):
            texts = [tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                                   tokenize=False) for p in prompts[i:i + batch_size]]
            batch = tokenizer(texts, return_tensors="pt", padding=True).to(reference.device)
            passes.clear()
            gen = reference.generate(**batch, max_new_tokens=max_new_tokens, do_sample=False,
                                     pad_token_id=tokenizer.pad_token_id)
            P = batch.input_ids.shape[1]
            tokens = gen[:, P:].cpu()
            later = torch.cat([p[:, -1:] for p in passes[1:tokens.shape[1]]], 1) if tokens.shape[1] > 1 else None
            for b, row in enumerate(tokens):
                pad = int((batch.attention_mask[b] == 0).sum())
                ends = (row == eos).nonzero()
                n = int(ends[0]) + 1 if len(ends) else len(row)
                prompt = batch.input_ids[b, pad:].cpu()
                hidden = [passes[0][b, pad:]] + ([later[b, :n - 1]] if n > 1 else [])
                out.append((torch.cat([prompt, row[:n]]), torch.cat(hidden).clone(), P - pad))
    finally:
        hook.remove()
        tokenizer.padding_side = side
    return out


def generate_examples(reference, tokenizer, prompts: list[str], max_new_tokens: int, batch_size: int,
                      progress: bool = True):
    """Greedy generations and, for each generated token s, the final hidden state h_s that produced it.

    Returns a list of (hidden [n, D], tokens [n]) per prompt, cut after the first EOS.
    """
    return [(hidden[p - 1:], tokens[p:]) for tokens, hidden, p
            in generate_sequences(reference, tokenizer, prompts, max_new_tokens, batch_size, progress)]


def make_dataset(examples, n_heads: int):
    """Tensors H [N, D], X [N] (token s), Y [N, K] (tokens s+1..s+K, -1 past the end)."""
    H, X, Y = [], [], []
    for hidden, tokens in examples:
        n = len(tokens)
        ys = torch.full((n, n_heads), -1, dtype=torch.long)
        for k in range(1, n_heads + 1):
            ys[: max(n - k, 0), k - 1] = tokens[k:]
        keep = ys[:, 0] >= 0  # at least token s+1 exists
        H.append(hidden[keep]), X.append(tokens[keep]), Y.append(ys[keep])
    return torch.cat(H), torch.cat(X), torch.cat(Y)


def head_accuracy(heads: MTPHeads, lm_rows, embed, H, X, Ys, batch: int = 1024) -> list[float]:
    """Top-1 accuracy of each head, over the examples that have its target (``Ys``: indices
    into the heads' vocabulary, -1 past the end, -2 for a token outside it: always wrong)."""
    right = torch.zeros(heads.n_heads)
    with torch.no_grad():
        for i in range(0, len(H), batch):
            pred = (heads(H[i:i + batch], embed[X[i:i + batch]]) @ lm_rows.T).argmax(-1)
            right += (pred == Ys[i:i + batch]).sum(0)
    return (right / (Ys != -1).sum(0).clamp_min(1)).tolist()


def train(seed: int = 0, n_prompts: int = N_PROMPTS, max_new_tokens: int = 64, batch_size: int = 48,
          n_heads: int = 3, rank: int = 256, epochs: int = 5, lr: float = 3e-3, train_batch: int = 256,
          vocab_size: int = 2048,
          out=HEADS_PATH, progress: bool = True, reference=None, tokenizer=None) -> dict:
    """Generate the data, train the heads, save them to ``out``; returns the run's metadata."""
    from tqdm.auto import tqdm

    from inference_internals.model import load_reference, load_tokenizer

    t0, cpu0 = time.perf_counter(), time.process_time()
    torch.manual_seed(seed)
    ref = reference if reference is not None else load_reference()
    tok = tokenizer if tokenizer is not None else load_tokenizer()
    prompts = training_prompts(n_prompts, seed)
    n_valid = max(1, len(prompts) // 10)  # a held-out tenth, to report honest accuracies
    examples = generate_examples(ref, tok, prompts, max_new_tokens, batch_size, progress)
    t_gen = time.perf_counter() - t0
    H, X, Y = make_dataset(examples[n_valid:], n_heads)
    Hv, Xv, Yv = make_dataset(examples[:n_valid], n_heads)

    vocab, to_small, coverage = draft_vocabulary(Y[Y >= 0], ref.config.vocab_size, vocab_size, outside=-2)

    def small(Y):  # token ids -> indices into the heads' vocabulary (-2: outside it)
        return torch.where(Y >= 0, to_small[Y.clamp_min(0)], -1)

    Ys = small(Y)

    # The heads train on the CPU, where the hidden states were collected: the reference's tables
    # come along from whatever device it generated on.
    embed = ref.get_input_embeddings().weight.detach().float().cpu()
    lm_rows = ref.get_output_embeddings().weight.detach().float().cpu()[vocab]
    heads = MTPHeads(ref.config.hidden_size, n_heads, rank, vocab)
    opt = torch.optim.AdamW(heads.parameters(), lr=lr, weight_decay=0.01)
    steps = epochs * ((len(H) + train_batch - 1) // train_batch)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=0.1)
    g = torch.Generator().manual_seed(seed)
    bar = tqdm(total=steps, desc="train", disable=not progress)
    for _ in range(epochs):
        order = torch.randperm(len(H), generator=g)
        for i in range(0, len(H), train_batch):
            idx = order[i:i + train_batch]
            z = heads(H[idx], embed[X[idx]])                  # [b, K, D]
            logits = z @ lm_rows.T                             # [b, K, V']
            target = Ys[idx].flatten()
            loss = F.cross_entropy(logits.flatten(0, 1), target.masked_fill(target == -2, -1), ignore_index=-1)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            bar.update()
            bar.set_postfix(loss=f"{loss.item():.3f}")
    bar.close()
    acc = head_accuracy(heads, lm_rows, embed, Hv, Xv, small(Yv))
    meta = {"seed": seed, "prompts": len(prompts), "held_out_prompts": n_valid, "train_examples": len(H),
            "max_new_tokens": max_new_tokens, "epochs": epochs, "rank": rank, "vocab": len(vocab),
            **coverage,
            "held_out_accuracy": acc, **run_cost(t0, cpu0, t_gen)}
    heads.save(out, meta)
    return meta


def main(argv=None) -> None:
    ap = arguments(__doc__, epochs=5, out=HEADS_PATH)
    ap.add_argument("--heads", type=int, default=3)
    ap.add_argument("--rank", type=int, default=256)
    args = ap.parse_args(argv)
    meta = train(seed=args.seed, n_prompts=args.prompts, max_new_tokens=args.new_tokens, n_heads=args.heads,
                 rank=args.rank, epochs=args.epochs, vocab_size=args.vocab, out=args.out)
    print(f"wrote {args.out}: {meta}")


if __name__ == "__main__":
    main()
