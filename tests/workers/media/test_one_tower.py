"""One-tower models (CLIP*WithProjection, Siglip*Model) equal transformers; an input of the other kind is a 400."""
import numpy as np
import pytest
import torch

from poolgate.shared.config.frozen import WorkerConfig
from poolgate.shared.domain.errors import InvalidRequest
from poolgate.shared.inputs.media.clip import dual_logit
from poolgate.workers.load.build import load_model
from tests.fakes import make_tiny_tokenizer
from tests.workers.media.dual_encoders import IMAGE_SIZE, PATCH, png, tower
from tests.workers.media.test_dual_encoders import embed, image

TEXTS = ["w1 w2 w3", "w40 w41"]
IMAGES = [png(21), png(22, 70, 33)]


def _unit(x: torch.Tensor) -> np.ndarray:
    return torch.nn.functional.normalize(x.float(), dim=-1).numpy()


async def test_clip_text_tower_alone(tmp_path):
    from transformers import AutoTokenizer, CLIPTextConfig, CLIPTextModelWithProjection

    torch.manual_seed(0)
    ref = CLIPTextModelWithProjection(CLIPTextConfig(**tower(vocab_size=100, max_position_embeddings=20),
                                                     projection_dim=12, pad_token_id=0, eos_token_id=3)).eval()
    ref.save_pretrained(tmp_path)
    make_tiny_tokenizer(tmp_path)  # no preprocessor_config.json: no image tower to process for
    model = load_model(WorkerConfig(model=str(tmp_path), served_model_name="t", dtype="float32"))
    assert model.info.modalities == ("text",) and model.info.embedding_dim == 12
    got = (await embed(model, TEXTS)).outputs.values
    t = AutoTokenizer.from_pretrained(str(tmp_path))(TEXTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        want = _unit(ref(input_ids=t["input_ids"], attention_mask=t["attention_mask"]).text_embeds)
    assert (got * want).sum(-1).min() >= 0.9999
    with pytest.raises(InvalidRequest, match="embeds text only; this input holds an image"):
        await embed(model, [image(IMAGES[0])])


@pytest.mark.parametrize("kind", ["clip", "siglip"])
async def test_vision_tower_alone_without_a_tokenizer(tmp_path, kind):
    import io

    from PIL import Image
    from transformers import (
        AutoImageProcessor,
        CLIPImageProcessorPil,
        CLIPVisionConfig,
        CLIPVisionModelWithProjection,
        SiglipImageProcessorPil,
        SiglipVisionConfig,
        SiglipVisionModel,
    )

    torch.manual_seed(0)
    vision = tower(image_size=IMAGE_SIZE, patch_size=PATCH)
    if kind == "clip":
        ref = CLIPVisionModelWithProjection(CLIPVisionConfig(**vision, projection_dim=12))
        CLIPImageProcessorPil(size={"shortest_edge": IMAGE_SIZE},
                              crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}).save_pretrained(tmp_path)
    else:
        ref = SiglipVisionModel(SiglipVisionConfig(**vision))
        SiglipImageProcessorPil(size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}).save_pretrained(tmp_path)
    ref.eval().save_pretrained(tmp_path)
    model = load_model(WorkerConfig(model=str(tmp_path), served_model_name="t", dtype="float32"))
    assert model.info.modalities == ("image",)
    with pytest.raises(ValueError, match="no logit scale"):  # a route asking for logits is told why not
        dual_logit(model.encoder.files.media, 0.5)
    got = (await embed(model, [image(b) for b in IMAGES])).outputs.values
    pixels = AutoImageProcessor.from_pretrained(str(tmp_path))(
        [Image.open(io.BytesIO(b)).convert("RGB") for b in IMAGES], return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        out = ref(pixel_values=pixels)
        want = _unit(out.image_embeds if kind == "clip" else out.pooler_output)
    assert (got * want).sum(-1).min() >= 0.9999
    with pytest.raises(InvalidRequest, match="embeds images only; an input holds text"):
        await embed(model, ["a caption"])
