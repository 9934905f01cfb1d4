"""s2s.language_id on real text (lingua's packaged models): the language of conversational sentences in several
languages, as an aggregate with a margin, and no language for a text too short to tell."""
from __future__ import annotations

import pytest

from s2s.language_id import MIN_CHARS, TextLanguage
from s2s.stt.parakeet import V3_LANGUAGES

SENTENCES = {
    "en": ["What is the weather going to be like tomorrow morning?",
           "Could you remind me to call my sister after lunch?",
           "I would like to book a table for two people tonight.",
           "How long does it take to drive from London to Manchester?",
           "Where is the nearest pharmacy?"],
    "fr": ["Quel temps fera-t-il demain matin à Paris ?",
           "Peux-tu me rappeler d'appeler ma sœur après le déjeuner ?",
           "Je voudrais réserver une table pour deux personnes ce soir.",
           "Combien de temps faut-il pour aller de Lyon à Marseille ?",
           "Où est la pharmacie la plus proche ?"],
    "de": ["Wie wird das Wetter morgen früh in Berlin?",
           "Kannst du mich daran erinnern, nach dem Mittagessen meine Schwester anzurufen?",
           "Ich möchte heute Abend einen Tisch für zwei Personen reservieren.",
           "Wie lange dauert die Fahrt von Hamburg nach München?",
           "Wo ist die nächste Apotheke?"],
    "es": ["¿Qué tiempo hará mañana por la mañana en Madrid?",
           "¿Puedes recordarme que llame a mi hermana después de comer?",
           "Quisiera reservar una mesa para dos personas esta noche.",
           "¿Cuánto se tarda en ir en coche de Sevilla a Valencia?",
           "¿Dónde está la farmacia más cercana?"],
    "it": ["Che tempo farà domani mattina a Roma?",
           "Puoi ricordarmi di chiamare mia sorella dopo pranzo?",
           "Vorrei prenotare un tavolo per due persone stasera.",
           "Quanto tempo ci vuole per andare in macchina da Milano a Napoli?",
           "Dov'è la farmacia più vicina?"],
    "ru": ["Какая погода будет завтра утром в Москве?",
           "Напомни мне, пожалуйста, позвонить сестре после обеда.",
           "Я хотел бы забронировать столик на двоих на сегодняшний вечер."],
    "nl": ["Wat voor weer wordt het morgenochtend in Amsterdam?",
           "Ik wil graag vanavond een tafel voor twee personen reserveren."],
    "pl": ["Jaka będzie jutro rano pogoda w Warszawie?",
           "Chciałbym zarezerwować stolik dla dwóch osób na dzisiejszy wieczór."],
}
SHORT = ["Ja bitte.", "Merci beaucoup.", "Okay, go on.", "Sí, claro.", "Grazie mille.", "Nein danke."]


@pytest.fixture(scope="module")
def detector():
    pytest.importorskip("lingua")
    return TextLanguage(V3_LANGUAGES)


def test_sentences_in_eight_languages_are_named_right(detector):
    said = [(language, text) for language, texts in SENTENCES.items() for text in texts]
    found = [detector.detect(text) for _, text in said]
    right = sum(got == language for got, (language, _) in zip(found, said))
    assert len(said) >= 30 and right >= 0.9 * len(said), list(zip(found, said))


def test_a_short_text_names_no_language(detector):
    assert all(len(text) < MIN_CHARS for text in SHORT)
    assert [detector.detect(text) for text in [*SHORT, "", "   "]] == [None] * (len(SHORT) + 2)
