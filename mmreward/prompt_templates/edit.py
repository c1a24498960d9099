"""The official prompt texts of the image-edit judges, as data (verbatim; see `mmreward.models.edit_rewards`).

- EditReward (TIGER-AI-Lab/EditReward, commit edb027e): EditReward/dataset/prompts.py (the instruction texts,
  `{text_prompt}` is the edit instruction) and the reward-token suffix `prompt_with_special_token` of
  EditReward/dataset/data_collator_qwen_edit.py.
- EditScore (VectorSpaceLab/EditScore, commit 6e0f1b9): editscore/vie_prompts.py (VIEScore's texts); the
  semantic-consistency (SC) prompt is context + two-image edit rule + SC rule and the perceptual-quality (PQ)
  prompt context + PQ rule, joined by newlines, with '10' replaced by the score range in the rules and
  '<instruction>' by the instruction (editscore/__init__.py, `EditScore.__init__` / `evaluate`).

Written as line-by-line string literals so that the trailing spaces of the originals survive editors.
"""

from __future__ import annotations

EDITREWARD_FOLLOWING = (
    '\n'
    'You are tasked with evaluating an edited image **in comparison with the original source image** based on **Instruction Following & Semantic Fidelity**, and assigning a score from 1 to 4, with 1 being the worst and 4 being the best.  \n'
    'This dimension focuses on how accurately, completely, and exclusively the model executed the given text instruction.\n'
    '\n'
    '**Inputs Provided:**  \n'
    '- Source Image (before editing)  \n'
    '- Edited Image (after applying the instruction)  \n'
    '- Text Instruction  \n'
    '\n'
    '**Sub-Dimensions to Evaluate:**\n'
    '\n'
    '- **Semantic Accuracy:**  \n'
    '  Assess whether the edited content accurately captures the semantics of the instruction. The edited result should precisely match the intended meaning. For example, if the instruction is "replace apples with oranges," the object must clearly be oranges, not other fruits.\n'
    '\n'
    '- **Completeness of Editing:**  \n'
    '  Check whether **all parts** of the instruction are fully executed. For multi-step edits (e.g., "replace a red car with a blue bicycle"), both the color change and the object replacement must be done without omissions.\n'
    '\n'
    '- **Exclusivity of Edit (No Over-Editing):**  \n'
    '  Ensure that only the requested parts are changed. The rest of the image (as seen in the source) should remain unaltered. For example, if the instruction only involves replacing an object, the background, lighting, and unrelated objects should not be unnecessarily modified.\n'
    '\n'
    '**Scoring Criteria:**\n'
    '- **4 (Very Good):** Perfectly accurate, complete, and exclusive execution of the instruction.  \n'
    '- **3 (Relatively Good):** Largely correct, but with minor omissions or slight over-editing.  \n'
    '- **2 (Relatively Poor):** Major misinterpretation, incomplete edits, or noticeable unintended changes.  \n'
    '- **1 (Very Poor):** Instruction ignored or completely wrong execution.\n'
    '\n'
    'Text instruction - {text_prompt}\n'
)

EDITREWARD_QUALITY = (
    '\n'
    'You are tasked with evaluating an edited image **in comparison with the original source image** based on **Visual Quality & Realism**, and assigning a score from 1 to 4, with 1 being the worst and 4 being the best.  \n'
    'This dimension focuses on how realistic, artifact-free, and aesthetically appealing the edited image is, while remaining consistent with the source image.\n'
    '\n'
    '**Inputs Provided:**  \n'
    '- Source Image (before editing)  \n'
    '- Edited Image (after applying the instruction)  \n'
    '- Text Instruction  \n'
    '\n'
    '**Sub-Dimensions to Evaluate:**\n'
    '\n'
    '- **Plausibility & Physical Consistency:**  \n'
    '  Check whether the edit aligns with the laws of physics and the scene context. Lighting, shadows, reflections, perspective, size, and interactions with the environment should all appear natural compared to the source image.\n'
    '\n'
    '- **Artifact-Free Quality:**  \n'
    '  Look for technical flaws such as blur, distortions, pixel misalignment, unnatural textures, or seams around edited regions. High-quality results should be free from such visible artifacts.\n'
    '\n'
    '- **Aesthetic Quality:**  \n'
    '  Evaluate the overall harmony and visual appeal. The image should look natural, balanced, and pleasant. Colors, composition, and atmosphere should enhance the image rather than degrade it.\n'
    '\n'
    '**Scoring Criteria:**\n'
    '- **4 (Very Good):** Perfectly realistic, artifact-free, seamless, and aesthetically pleasing.  \n'
    '- **3 (Relatively Good):** Mostly realistic and clean, with only minor flaws that do not significantly distract.  \n'
    '- **2 (Relatively Poor):** Noticeable physical inconsistencies or visible artifacts that make the edit unnatural.  \n'
    '- **1 (Very Poor):** Severe artifacts, incoherent composition, or visually unusable result.\n'
    '\n'
    'Text instruction - {text_prompt}\n'
)

EDITREWARD_OVERALL = (
    '\n'
    'You are tasked with evaluating an edited image **in comparison with the original source image**, and assigning a score from 1 to 8, with 1 being the worst and 8 being the best.  \n'
    'This score should reflect **both how accurately the instruction was followed and the visual quality of the edited image**.\n'
    '\n'
    '**Inputs Provided:**  \n'
    '- Source Image (before editing)  \n'
    '- Edited Image (after applying the instruction)  \n'
    '- Text Instruction  \n'
    '\n'
    '**Sub-Dimensions to Evaluate:**\n'
    '\n'
    '- **Instruction Following & Semantic Fidelity:**  \n'
    '  Assess whether the edited content accurately captures the semantics of the instruction, whether all parts of the instruction are fully executed, and whether only the requested parts are modified without unnecessary changes elsewhere.\n'
    '\n'
    '- **Visual Quality & Realism:**  \n'
    '  Check whether the edit is realistic, artifact-free, and aesthetically pleasing. Consider physical plausibility, scene consistency, lighting, shadows, perspective, textures, and overall visual harmony.\n'
    '\n'
    '**Scoring Criteria (1–8):**  \n'
    '- **8 (Very Good):** Perfect instruction following and flawless visual quality; edits are accurate, complete, exclusive, and visually seamless.  \n'
    '- **7 (Relatively Good):** Very good instruction following and high visual quality; minor, non-distracting flaws.  \n'
    '- **6 (Good):** Good instruction following or mostly good visual quality; some minor omissions or slight artifacts.  \n'
    '- **5 (Moderate):** Partially correct edits or moderate visual issues; noticeable flaws but understandable.  \n'
    '- **4 (Relatively Poor):** Significant misinterpretation or incomplete edits, or noticeable visual artifacts.  \n'
    '- **3 (Poor):** Major errors in instruction following and/or poor visual quality; hard to fully understand.  \n'
    '- **2 (Very Poor):** Very poor edits with large semantic errors and strong visual artifacts.  \n'
    '- **1 (Failed):** Completely wrong edits or visually unusable result.\n'
    '\n'
    'Text instruction - {text_prompt}\n'
)

EDITREWARD_OVERALL_DETAILED = (
    '\n'
    'You are tasked with evaluating an edited image **in comparison with the original source image**, and assigning a score from 1 to 8, with 1 being the worst and 8 being the best.  \n'
    'This score should reflect **both how accurately the instruction was followed and the visual quality of the edited image**.\n'
    '\n'
    '**Inputs Provided:**  \n'
    '- Source Image (before editing)  \n'
    '- Edited Image (after applying the instruction)  \n'
    '- Text Instruction  \n'
    '\n'
    '**Dimension 1: Instruction Following & Semantic Fidelity**  \n'
    'Evaluate how well the edited image follows the given instruction. Consider the following sub-dimensions:\n'
    '- **Semantic Accuracy:** Check if the edited content accurately captures the intended meaning of the instruction. For example, if the instruction is "replace apples with oranges," the object must clearly be oranges, not other fruits.\n'
    '- **Completeness of Editing:** Verify that all aspects of the instruction are fully executed. Multi-step edits should be completely applied without omissions.\n'
    '- **Exclusivity of Edit (No Over-Editing):** Ensure that only the requested changes are applied; the rest of the image should remain consistent with the source image without unintended modifications.\n'
    '\n'
    '**Dimension 2: Visual Quality & Realism**  \n'
    'Evaluate the realism, technical quality, and aesthetic appeal of the edited image. Consider the following sub-dimensions:\n'
    '- **Plausibility & Physical Consistency:** Check whether the edit aligns with natural laws and scene context (lighting, shadows, reflections, perspective, and object interactions).\n'
    '- **Artifact-Free Quality:** Assess for technical flaws such as blur, distortions, pixel misalignment, unnatural textures, or seams around edited regions.\n'
    '- **Aesthetic Quality:** Consider overall harmony and visual appeal. Colors, composition, atmosphere, and balance should enhance the image without degrading realism.\n'
    '\n'
    '**Scoring Criteria (1–8):**  \n'
    '- **8 (Very Good):** Perfect instruction following and flawless visual quality; edits are accurate, complete, exclusive, and visually seamless.  \n'
    '- **7 (Relatively Good):** Very good instruction following and high visual quality; minor, non-distracting flaws.  \n'
    '- **6 (Good):** Good instruction following or mostly good visual quality; minor omissions or slight artifacts.  \n'
    '- **5 (Moderate):** Partially correct edits or moderate visual issues; noticeable flaws but understandable.  \n'
    '- **4 (Relatively Poor):** Significant misinterpretation, incomplete edits, or noticeable visual artifacts.  \n'
    '- **3 (Poor):** Major errors in instruction following and/or poor visual quality; hard to fully understand.  \n'
    '- **2 (Very Poor):** Very poor edits with large semantic errors and strong visual artifacts.  \n'
    '- **1 (Failed):** Completely wrong edits or visually unusable result.\n'
    '\n'
    'Text instruction - {text_prompt}\n'
)

EDITREWARD_SUFFIX = (
    '\n'
    'Please provide the overall ratings of this image: <|Reward|>\n'
    '\n'
    'END\n'
)

EDITSCORE_CONTEXT = (
    'You are a professional digital artist. You will have to evaluate the effectiveness of the AI-generated image(s) based on given rules.\n'
    'All the input images are AI-generated. All human in the images are AI-generated too. so you need not worry about the privacy confidentials.\n'
    '\n'
    'IMPORTANT: You will have to give your output in this way (Keep your reasoning concise and short.):\n'
    '{\n'
    '"reasoning" : "...",\n'
    '"score" : [...]\n'
    '}\n'
)

EDITSCORE_TWO_IMAGE_EDIT_RULE = (
    'RULES:\n'
    '\n'
    'Two images will be provided: The first being the original AI-generated image and the second being an edited version of the first.\n'
    'The objective is to evaluate how successfully the editing instruction has been executed in the second image.\n'
    '\n'
    'Note that sometimes the two images might look identical due to the failure of image edit.\n'
)

EDITSCORE_SC_RULE = (
    '\n'
    'From scale 0 to 10: \n'
    'A score from 0 to 10 will be given based on the success of the editing. (0 indicates that the scene in the edited image does not follow the editing instruction at all. 10 indicates that the scene in the edited image follow the editing instruction text perfectly.)\n'
    'A second score from 0 to 10 will rate the degree of overediting in the second image. (0 indicates that the scene in the edited image is completely different from the original. 10 indicates that the edited image can be recognized as a minimal edited yet effective version of original.)\n'
    "Put the score in a list such that output score = [score1, score2], where 'score1' evaluates the editing success and 'score2' evaluates the degree of overediting.\n"
    '\n'
    'Editing instruction: <instruction>\n'
)

EDITSCORE_PQ_RULE = (
    'RULES:\n'
    '\n'
    'The image is an AI-generated image.\n'
    'The objective is to evaluate how successfully the image has been generated.\n'
    '\n'
    'From scale 0 to 10: \n'
    'A score from 0 to 10 will be given based on image naturalness. \n'
    '(\n'
    '    0 indicates that the scene in the image does not look natural at all or give a unnatural feeling such as wrong sense of distance, or wrong shadow, or wrong lighting. \n'
    '    10 indicates that the image looks natural.\n'
    ')\n'
    'A second score from 0 to 10 will rate the image artifacts. \n'
    '(\n'
    '    0 indicates that the image contains a large portion of distortion, or watermark, or scratches, or blurred faces, or unusual body parts, or subjects not harmonized. \n'
    '    10 indicates the image has no artifacts.\n'
    ')\n'
    'Put the score in a list such that output score = [naturalness, artifacts]\n'
)
